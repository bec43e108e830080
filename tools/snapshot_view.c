/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_view.c - gca-snapshot: renders a snapshot JSON (gca_snapshot_json,
 * or PyTorch's torch.cuda.memory._snapshot() dumped as JSON or as the pickle
 * _dump_snapshot writes, read as plain data only) as a self-contained HTML
 * page or, with --text, as a plain summary.
 *
 * Exit status: 0 rendered; 1 the output could not be written; 2 bad usage, an
 * unreadable input, malformed JSON or a snapshot missing a required field.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_model.h"

#define EXIT_OUTPUT 1
#define EXIT_INPUT  2

static void usage(FILE *f) {
  fprintf(f, "usage: gca-snapshot SNAPSHOT.json [-o page.html] [--text] [--top N]\n"
             "       gca-snapshot SNAPSHOT.json --pickle OUT.pickle\n"
             "\n"
             "  --pickle F write the snapshot as a pickle with PyTorch's fields (what\n"
             "             torch.cuda.memory._dump_snapshot writes; PyTorch's viewer opens it)\n"
             "  -o FILE    write the HTML page to FILE ('-' for stdout; default: SNAPSHOT.html)\n"
             "  --text     print a plain summary on stdout instead (segments, totals by\n"
             "             block state, largest live blocks, history figures)\n"
             "  --top N    how many of the largest live blocks to list (default 10)\n");
}

/* SNAPSHOT.json -> SNAPSHOT.html (malloc'd). */
static char *default_output(const char *input) {
  size_t n = strlen(input);
  if (n > 5 && strcmp(input + n - 5, ".json") == 0)
    n -= 5;
  char *out = malloc(n + 6);
  if (out) {
    memcpy(out, input, n);
    strcpy(out + n, ".html");
  }
  return out;
}

/* --pickle: the snapshot JSON at input converted by the library
 * (gca_snapshot_json_to_pickle) and written to out. */
static int write_pickle(const char *input, const char *out) {
  char *buf = NULL;
  size_t n = 0;
  if (tool_read_file(input, &buf, &n) != GCA_OK) {
    fprintf(stderr, "gca-snapshot: %s\n", tool_last_error());
    return EXIT_INPUT;
  }
  char *pk = NULL;
  size_t pklen = 0;
  gca_status_t st = gca_snapshot_json_to_pickle(buf, n, &pk, &pklen);
  free(buf);
  if (st != GCA_OK) {
    fprintf(stderr, "gca-snapshot: '%s': %s\n", input, gca_last_error());
    return EXIT_INPUT;
  }
  FILE *o = fopen(out, "wb");
  int rc = 0;
  if (!o || fwrite(pk, 1, pklen, o) != pklen)
    rc = EXIT_OUTPUT;
  if (o && fclose(o) != 0)
    rc = EXIT_OUTPUT;
  if (rc)
    fprintf(stderr, "gca-snapshot: cannot write '%s'\n", out);
  gca_string_free(pk);
  return rc;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"output", required_argument, NULL, 'o'}, {"text", no_argument, NULL, 't'},
      {"top", required_argument, NULL, 'n'},    {"pickle", required_argument, NULL, 'p'},
      {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
  };
  const char *output = NULL, *pickle_out = NULL;
  bool text = false;
  size_t top = 10;
  int c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
    switch (c) {
    case 'o':
      output = optarg;
      break;
    case 't':
      text = true;
      break;
    case 'p':
      pickle_out = optarg;
      break;
    case 'n': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*end || end == optarg || v < 0 || v > 256) {
        fprintf(stderr, "gca-snapshot: --top '%s': expected a count in 0..256\n", optarg);
        return EXIT_INPUT;
      }
      top = (size_t)v;
      break;
    }
    case 'h':
      usage(stdout);
      return 0;
    default:
      fprintf(stderr, "gca-snapshot: unknown or incomplete option '%s'\n", argv[optind - 1]);
      usage(stderr);
      return EXIT_INPUT;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return EXIT_INPUT;
  }
  const char *input = argv[optind];
  if (pickle_out)
    return write_pickle(input, pickle_out);
  snapshot_t snap;
  if (gca__snapshot_load_file(input, &snap) != GCA_OK) {
    fprintf(stderr, "gca-snapshot: %s\n", tool_last_error());
    return EXIT_INPUT;
  }
  int rc = 0;
  if (text) {
    gca__snapshot_write_text(&snap, top, stdout);
    if (fflush(stdout) != 0) {
      fprintf(stderr, "gca-snapshot: writing the summary failed\n");
      rc = EXIT_OUTPUT;
    }
    goto out_snap;
  }
  char *path = output ? strdup(output) : default_output(input);
  if (!path) {
    fprintf(stderr, "gca-snapshot: out of memory\n");
    rc = EXIT_OUTPUT;
    goto out_snap;
  }
  FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
  if (!f) {
    fprintf(stderr, "gca-snapshot: cannot write '%s'\n", path);
    rc = EXIT_OUTPUT;
    goto out_path;
  }
  if (gca__snapshot_write_html(&snap, input, top, f) != GCA_OK) {
    fprintf(stderr, "gca-snapshot: '%s': %s\n", path, tool_last_error());
    rc = EXIT_OUTPUT;
  }
  if (f != stdout && fclose(f) != 0 && rc == 0) {
    fprintf(stderr, "gca-snapshot: closing '%s' failed\n", path);
    rc = EXIT_OUTPUT;
  }
  if (rc == 0 && f != stdout)
    fprintf(stderr, "gca-snapshot: wrote %s\n", path);

out_path:
  free(path);
out_snap:
  gca__snapshot_free(&snap);
  return rc;
}
