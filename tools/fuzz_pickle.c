/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_pickle.c - fuzz target for the restricted pickle reader and the
 * PyTorch snapshot conversion, with its seeds and alphabet for the
 * standalone driver (fuzz_driver.h).
 *
 * The one idea: any input either parses into plain data that the snapshot
 * conversion then accepts or refuses with a status, or is refused with
 * GCA_ERR_PARSE naming an offset; nothing else (no crash, no leak, no other
 * status). Built with -fsanitize=fuzzer it is a libFuzzer target; linked with
 * fuzz_driver.c it runs in the default test suite. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_driver.h"
#include "torch_snapshot.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  py_doc_t *doc = NULL;
  const py_value_t *root = NULL;
  gca_status_t st = py_pickle_load(data, size, "fuzz", &doc, &root);
  if (st != GCA_OK) {
    if ((st != GCA_ERR_PARSE && st != GCA_ERR_OUT_OF_MEMORY) ||
        !strstr(tool_last_error(), "fuzz")) {
      fprintf(stderr, "fuzz_pickle: unexpected failure %d: %s\n", (int)st, tool_last_error());
      abort();
    }
    if (doc)
      abort();
    return 0;
  }
  torch_events_t te;
  st = torch_snapshot_events(root, "fuzz", 0, &te);
  if (st == GCA_OK)
    free(te.events);
  else if (st != GCA_ERR_PARSE && st != GCA_ERR_INVALID_ARGUMENT && st != GCA_ERR_OUT_OF_MEMORY)
    abort();
  py_doc_free(doc);
  return 0;
}

/* Seeds without NUL bytes (the driver's seeds are texts): protocol 4 with
 * MEMOIZE instead of indexed PUTs. */
static const char *const seeds[] = {
    "\x80\x04}\x94.",
    "\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0d"
    "device_traces\x94]\x94]\x94(}\x94(\x8c"
    "\x06"
    "action\x94\x8c\x05"
    "alloc\x94\x8c\x04"
    "addr\x94J\x01\x02\x03\x04\x8c\x04size\x94K"
    "\x40\x8c\x06stream\x94K\x01u}\x94(h\x08\x8c\x0e"
    "free_requested\x94h\x0aJ\x01\x02\x03\x04h"
    "\x0cK\x40ueau.",
    "\x80\x02]q\x01(K\x01G?\xf0\x01\x01\x01\x01\x01\x01\x88\x89N\x8c\x01"
    "xC\x02yy\x86\x85"
    "e.",
    "\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x04true\x85R.",
};

static const char *const words[] = {"\x8c\x06"
                                    "action",
                                    "\x8c\x05"
                                    "alloc",
                                    "\x8c\x04"
                                    "addr",
                                    "\x8c\x04size",
                                    "\x8c\x0e"
                                    "free_requested",
                                    "}\x94",
                                    "]\x94",
                                    "(",
                                    "u",
                                    "e",
                                    "a",
                                    "s",
                                    "h\x01",
                                    "\x94",
                                    ".",
                                    "K\x01",
                                    "J\x01\x01\x01\x01"};

const fuzz_target_t fuzz_target = {
    .name = "fuzz_pickle",
    .seeds = seeds,
    .nseeds = sizeof(seeds) / sizeof(seeds[0]),
    .max_input = 4096,
    .alphabet = "\x80\x95.(}])NJKMGXCB\x8a\x8b\x8c\x8d\x8e\x85\x86\x87taeus qrhj\x94"
                "012\x88\x89"
                "c\x93RbioPQ",
    .words = words,
    .nwords = sizeof(words) / sizeof(words[0]),
    .max_run = 64,
    .max_copies = 8,
    .long_run = "(]",
    .max_long_run = 2048,
};
