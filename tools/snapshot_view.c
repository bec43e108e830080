/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_view.c - gca-snapshot: renders a snapshot (gca_snapshot_json, or
 * PyTorch's torch.cuda.memory._snapshot() dumped as JSON or as the pickle
 * _dump_snapshot writes, read as plain data only) as a self-contained HTML
 * page or, with --text, as a plain summary. Given two snapshots (each of
 * either kind) the page shows them side by side: PyTorch's run and gca's
 * replay of it, say.
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
  fprintf(f, "usage: gca-snapshot SNAPSHOT [-o page.html] [--text] [--top N]\n"
             "       gca-snapshot SNAPSHOT_A SNAPSHOT_B [-o page.html] [--top N]\n"
             "       gca-snapshot SNAPSHOT.json --pickle OUT.pickle\n"
             "\n"
             "  A snapshot is gca's JSON (gca_snapshot_json, gca-replay --snapshot) or\n"
             "  PyTorch's, as JSON or as the pickle torch.cuda.memory._dump_snapshot writes.\n"
             "  Two snapshots are drawn side by side on one page, their timelines sharing\n"
             "  the time axis (from each one's first event).\n"
             "\n"
             "  --pickle F write the snapshot as a pickle with PyTorch's fields (what\n"
             "             torch.cuda.memory._dump_snapshot writes; PyTorch's viewer opens it)\n"
             "  -o FILE    write the HTML page to FILE ('-' for stdout; default: SNAPSHOT.html,\n"
             "             or SNAPSHOT_A-vs-SNAPSHOT_B.html for two)\n"
             "  --text     print a plain summary on stdout instead (segments, totals by\n"
             "             block state, largest live blocks, history figures)\n"
             "  --top N    how many of the largest live blocks to list (default 10)\n");
}

/* The length of path without a final ".json". */
static size_t stem_length(const char *path) {
  size_t n = strlen(path);
  return n > 5 && strcmp(path + n - 5, ".json") == 0 ? n - 5 : n;
}

/* SNAPSHOT.json -> SNAPSHOT.html; A.json B.json -> A-vs-B.html, B's directory
 * left out (malloc'd). */
static char *default_output(const char *a, const char *b) {
  size_t na = stem_length(a), nb = 0;
  if (b) {
    const char *slash = strrchr(b, '/');
    b = slash ? slash + 1 : b;
    nb = stem_length(b);
  }
  char *out = malloc(na + nb + 10);
  if (out) {
    memcpy(out, a, na);
    size_t k = na;
    if (b) {
      memcpy(out + k, "-vs-", 4);
      memcpy(out + k + 4, b, nb);
      k += 4 + nb;
    }
    strcpy(out + k, ".html");
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
  size_t ninputs = (size_t)(argc - optind);
  if (ninputs < 1 || ninputs > 2) {
    usage(stderr);
    return EXIT_INPUT;
  }
  const char *const *inputs = (const char *const *)argv + optind;
  if (ninputs == 2 && (text || pickle_out)) {
    fprintf(stderr, "gca-snapshot: %s takes one snapshot; two make a page\n",
            text ? "--text" : "--pickle");
    return EXIT_INPUT;
  }
  if (pickle_out)
    return write_pickle(inputs[0], pickle_out);
  snapshot_t snaps[2] = {{0}};
  int rc = 0;
  size_t loaded = 0;
  for (; loaded < ninputs; loaded++) {
    if (gca__snapshot_load_file(inputs[loaded], &snaps[loaded]) != GCA_OK) {
      fprintf(stderr, "gca-snapshot: %s\n", tool_last_error());
      rc = EXIT_INPUT;
      goto out_snaps;
    }
  }
  if (text) {
    gca__snapshot_write_text(&snaps[0], top, stdout);
    if (fflush(stdout) != 0) {
      fprintf(stderr, "gca-snapshot: writing the summary failed\n");
      rc = EXIT_OUTPUT;
    }
    goto out_snaps;
  }
  char *path = output ? strdup(output) : default_output(inputs[0], ninputs > 1 ? inputs[1] : NULL);
  if (!path) {
    fprintf(stderr, "gca-snapshot: out of memory\n");
    rc = EXIT_OUTPUT;
    goto out_snaps;
  }
  FILE *f = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
  if (!f) {
    fprintf(stderr, "gca-snapshot: cannot write '%s'\n", path);
    rc = EXIT_OUTPUT;
    goto out_path;
  }
  if (gca__snapshot_write_html(snaps, inputs, ninputs, top, f) != GCA_OK) {
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
out_snaps:
  for (size_t i = 0; i < loaded; i++)
    gca__snapshot_free(&snaps[i]);
  return rc;
}
