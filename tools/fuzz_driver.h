/* SPDX-License-Identifier: Apache-2.0 */
/* fuzz_driver.h - what a fuzz target tells the standalone driver about itself.
 *
 * A fuzz target is a file that defines LLVMFuzzerTestOneInput. Built with
 * -fsanitize=fuzzer, libFuzzer drives it and nothing here is used. Linked with
 * fuzz_driver.c instead, the driver's main runs the target's built-in seeds and
 * the seed files named on the command line, then mutates them for N iterations
 * (or T seconds) from a printed, settable seed, so that the default test suite
 * runs every target, under the sanitizers too. The one idea: the driver owns
 * the loop and the generic edits; the target owns only its description — its
 * name, its seeds, its size limit and the bytes and words its grammar is made
 * of — in the one object `fuzz_target` it defines.
 */
#ifndef GCA_TOOL_FUZZ_DRIVER_H
#define GCA_TOOL_FUZZ_DRIVER_H

#include <stddef.h>
#include <stdint.h>

typedef struct fuzz_target {
  const char *name;         /* starts every line the driver prints */
  const char *const *seeds; /* built-in seeds, NUL-terminated texts */
  size_t nseeds;            /* at least 1 */
  size_t max_input;         /* largest input tried; a seed file is read up to half of it */
  const char *alphabet;     /* bytes the grammar cares about, written over and inserted */
  const char *const *words; /* pieces of the grammar inserted whole; NULL for none */
  size_t nwords;
  const char *const *keys; /* more such pieces, kept by the code under test (its key list) */
  size_t nkeys;
  size_t max_run;       /* longest run duplicated (a quarter of it deleted) */
  unsigned max_copies;  /* a duplicated run goes in 1..max_copies times */
  const char *long_run; /* over-long tokens: a run of one of these bytes; NULL for none */
  size_t max_long_run;  /* up to this long */
} fuzz_target_t;

/* Defined by each target for the standalone driver. */
extern const fuzz_target_t fuzz_target;

/* Defined by each target; the driver calls it for every input. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
