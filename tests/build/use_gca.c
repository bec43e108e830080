/* SPDX-License-Identifier: Apache-2.0 */
/* use_gca.c - a program that knows gca only from its installed face: the
 * public headers and libgca. It allocates, touches and frees through the
 * caching allocator (on the sim backend, where device memory is host memory)
 * and checks the statistics; the subproject and install tests build it. */
#include <gca.h>
#include <stdio.h>
#include <string.h>

#define SIZE (3 << 20)

static int fail(const char *what) {
  fprintf(stderr, "use_gca: %s: %s\n", what, gca_last_error());
  return 1;
}

int main(void) {
  void *p = NULL;
  gca_stats_t st;
  if (gca_malloc(&p, SIZE, NULL) != GCA_OK)
    return fail("gca_malloc");
  memset(p, 0x5a, SIZE);
  if (gca_get_stats(0, &st) != GCA_OK)
    return fail("gca_get_stats");
  if (st.allocated_bytes[GCA_STAT_ALL].current != SIZE)
    return fail("allocated bytes after gca_malloc");
  if (gca_free(p) != GCA_OK)
    return fail("gca_free");
  if (gca_get_stats(0, &st) != GCA_OK || st.allocated_bytes[GCA_STAT_ALL].current != 0 ||
      st.reserved_bytes[GCA_STAT_ALL].current < SIZE)
    return fail("statistics after gca_free (nothing allocated, the segment cached)");
  printf("use_gca: %s: allocated, touched and freed %d bytes\n", gca_version_string(), SIZE);
  return 0;
}
