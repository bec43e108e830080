/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_text.c - gca-snapshot --text: the snapshot as a plain summary,
 * exact byte counts first (for scripts and diffs) with a human-readable size
 * beside them.
 */
#include <inttypes.h>

#include "snapshot_model.h"

static void line_bytes(FILE *f, const char *label, uint64_t bytes, uint64_t count,
                       const char *unit) {
  char buf[32];
  fprintf(f, "  %-20s %14" PRIu64 "  ", label, bytes);
  if (unit)
    fprintf(f, "%-12s  %" PRIu64 " %s%s\n", tool_format_size(bytes, buf, sizeof(buf)), count, unit,
            count == 1 ? "" : "s");
  else
    fprintf(f, "%s\n", tool_format_size(bytes, buf, sizeof(buf)));
}

static void write_frames(FILE *f, const snap_block_t *b) {
  for (size_t i = 0; i < b->nframes; i++) {
    const snap_frame_t *fr = &b->frames[i];
    fprintf(f, "      at %s", fr->name[0] ? fr->name : "??");
    if (fr->filename[0] && fr->line > 0)
      fprintf(f, " (%s:%" PRId64 ")", fr->filename, fr->line);
    else if (fr->filename[0])
      fprintf(f, " (%s)", fr->filename);
    fputc('\n', f);
  }
}

void gca__snapshot_write_text(const snapshot_t *s, size_t top, FILE *f) {
  size_t nevents = 0;
  for (size_t i = 0; i < s->ntraces; i++)
    nevents += s->traces[i].nevents;
  fprintf(f, "snapshot: %zu segments, %zu blocks on %zu device%s; %zu history events\n",
          s->nsegments, s->nblocks, s->ndevices, s->ndevices == 1 ? "" : "s", nevents);
  fprintf(f, "totals:\n");
  line_bytes(f, "reserved", s->reserved, s->nsegments, "segment");
  for (int st = 0; st < SNAP_STATES; st++)
    line_bytes(f, gca__snapshot_state_name((snap_state_t)st), s->by_state[st],
               s->count_by_state[st], "block");
  line_bytes(f, "requested", s->requested, 0, NULL);

  fprintf(f, "segments:\n");
  fprintf(f, "  %-6s %-18s %14s %14s %-6s %-10s %s\n", "device", "address", "total", "allocated",
          "type", "stream", "blocks");
  for (size_t i = 0; i < s->nsegments; i++) {
    const snap_segment_t *sg = &s->segments[i];
    uint64_t allocated = 0;
    for (size_t j = 0; j < sg->nblocks; j++) {
      const snap_block_t *b = &s->blocks[sg->first_block + j];
      if (b->state == SNAP_ACTIVE_ALLOCATED)
        allocated += b->size;
    }
    fprintf(f,
            "  %-6" PRId64 " 0x%-16" PRIx64 " %14" PRIu64 " %14" PRIu64 " %-6s 0x%-8" PRIx64
            " %zu%s\n",
            sg->device, sg->address, sg->total_size, allocated, sg->is_large ? "large" : "small",
            sg->stream, sg->nblocks, sg->is_expandable ? " (expandable)" : "");
  }

  size_t idx[64];
  if (top > TOOL_ARRAY_SIZE(idx))
    top = TOOL_ARRAY_SIZE(idx);
  size_t n = gca__snapshot_largest(s, idx, top);
  fprintf(f, "largest live blocks:%s\n", n == 0 ? " none" : "");
  for (size_t i = 0; i < n; i++) {
    const snap_block_t *b = &s->blocks[idx[i]];
    fprintf(f,
            "  0x%-16" PRIx64 " %14" PRIu64 " bytes (requested %" PRIu64 ") in segment 0x%" PRIx64
            "\n",
            b->address, b->size, b->requested_size, s->segments[b->segment].address);
    write_frames(f, b);
  }

  for (size_t i = 0; i < s->ntraces; i++) {
    const snap_trace_t *t = &s->traces[i];
    fprintf(f, "history device %" PRId64 ": %zu events", t->device, t->nevents);
    if (t->nevents > 0)
      fprintf(f,
              ", peak allocated %" PRId64 ", peak reserved %" PRId64
              ", before the first event allocated %" PRId64 " reserved %" PRId64,
              t->peak_allocated, t->peak_reserved, t->allocated_before, t->reserved_before);
    fputc('\n', f);
  }
}
