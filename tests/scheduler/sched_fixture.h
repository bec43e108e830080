/* SPDX-License-Identifier: Apache-2.0 */
/* sched_fixture.h - what the scheduler's tests share: loading a graph from
 * text and the example FSDP graph whose path the test gets as argv[1]. */
#ifndef GCA_TEST_SCHED_FIXTURE_H
#define GCA_TEST_SCHED_FIXTURE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static const char *example_path;

__attribute__((unused)) static gca_opgraph_t *load_text(const char *text, size_t len) {
  gca_opgraph_t *g = NULL;
  assert_ok(gca_opgraph_load_json(text, len, &g));
  return g;
}

__attribute__((unused)) static gca_opgraph_t *load_example(void) {
  FILE *f = fopen(example_path, "rb");
  if (!f)
    fail_msg("cannot open %s", example_path);
  static char buf[1 << 16];
  size_t len = fread(buf, 1, sizeof(buf), f);
  fclose(f);
  return load_text(buf, len);
}

#endif
