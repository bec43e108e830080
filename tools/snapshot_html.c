/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_html.c - gca-snapshot's page: one self-contained HTML file whose
 * inline script draws SVG from a JSON data island the C side writes.
 *
 * The split keeps each side simple: C decides every number (the timeline's
 * points, block offsets, the largest blocks) and prints them as JSON (by hand:
 * numbers, and strings through tool_json_string, which never writes a raw
 * '<', so no "</script>" can end the island early); the script only lays
 * them out. The page fetches nothing. When the
 * script has drawn everything it sets data-gca-drawn="1" (and counts of what
 * it drew) on <body>, which a headless browser's DOM dump shows.
 */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_model.h"
#include "util.h"

static const char page_head[] =
    "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
    "<style>\n"
    "body{font:14px/1.4 system-ui,sans-serif;margin:20px;color:#222;background:#fff}\n"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}\n"
    ".totals td{padding:1px 12px 1px 0}.totals "
    "td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
    "table.blocks{border-collapse:collapse}table.blocks td,table.blocks th{border-bottom:1px solid "
    "#ddd;"
    "padding:3px 10px 3px 0;text-align:left;vertical-align:top}\n"
    "pre{margin:2px 0;font-size:12px;color:#444}\n"
    ".legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 "
    "14px;vertical-align:-2px}\n"
    "svg text{font:11px system-ui,sans-serif;fill:#333}\n"
    ".note{color:#666}\n"
    "</style>\n";

static const char page_script[] =
    "<script>\n"
    "(function(){\n"
    "'use strict';\n"
    "var D=JSON.parse(document.getElementById('gca-data').textContent);\n"
    "var NS='http://www.w3.org/2000/svg';\n"
    "var COLORS=['#d9534f','#f0ad4e','#9fd39f'];\n"
    "var NAMES=['active_allocated','active_pending_free','inactive'];\n"
    "function el(tag,attrs,parent,text){var e=document.createElementNS(NS,tag);"
    "for(var k in attrs)e.setAttribute(k,attrs[k]);if(text!==undefined)e.textContent=text;"
    "if(parent)parent.appendChild(e);return e;}\n"
    "function h(tag,parent,text){var e=document.createElement(tag);if(text!==undefined)"
    "e.textContent=text;if(parent)parent.appendChild(e);return e;}\n"
    "function fmt(b){var u=['B','KiB','MiB','GiB','TiB'],i=0;while(Math.abs(b)>=1024&&i<4)"
    "{b/=1024;i++;}return (i?b.toFixed(2):String(b))+' '+u[i];}\n"
    "var points=0,rects=0;\n"
    "function drawTimeline(host,tr){\n"
    "  var W=900,H=260,L=80,R=20,T=12,B=34;\n"
    "  var svg=el('svg',{width:W,height:H,'class':'timeline','data-device':tr.device},host);\n"
    "  var n=tr.t.length,t0=tr.t[0],t1=tr.t[n-1];if(t1<=t0)t1=t0+1;\n"
    "  var ymax=1;for(var i=0;i<n;i++){ymax=Math.max(ymax,tr.a[i],tr.r[i]);}\n"
    "  function X(t){return L+(t-t0)/(t1-t0)*(W-L-R);}\n"
    "  function Y(v){return H-B-v/ymax*(H-T-B);}\n"
    "  for(var k=0;k<=4;k++){var v=ymax*k/4,y=Y(v);\n"
    "    el('line',{x1:L,x2:W-R,y1:y,y2:y,stroke:'#eee'},svg);\n"
    "    el('text',{x:L-6,y:y+4,'text-anchor':'end'},svg,fmt(Math.round(v)));}\n"
    "  el('line',{x1:L,x2:W-R,y1:H-B,y2:H-B,stroke:'#999'},svg);\n"
    "  el('text',{x:L,y:H-B+16},svg,tr.hasTimes?'0 ms':'event 0');\n"
    "  el('text',{x:W-R,y:H-B+16,'text-anchor':'end'},svg,tr.hasTimes?((t1-t0)/1000).toFixed(3)+' "
    "ms'"
    ":'event '+(n-1));\n"
    "  function path(vals,color,cls){var d='M'+X(tr.t[0]).toFixed(1)+','+Y(vals[0]).toFixed(1);\n"
    "    for(var i=1;i<n;i++){d+='H'+X(tr.t[i]).toFixed(1)+'V'+Y(vals[i]).toFixed(1);}\n"
    "    el('path',{d:d,fill:'none',stroke:color,'stroke-width':1.5,'class':cls},svg);}\n"
    "  path(tr.r,'#337ab7','reserved');path(tr.a,'#d9534f','allocated');\n"
    "  points+=n;\n"
    "}\n"
    "function drawSegments(host){\n"
    "  var segs=D.segments,W=900,LBL=220,ROW=18,maxT=1;\n"
    "  for(var i=0;i<segs.length;i++)maxT=Math.max(maxT,segs[i].total);\n"
    "  var "
    "svg=el('svg',{width:W,height:Math.max(ROW,segs.length*ROW+4),'class':'segments'},host);\n"
    "  for(var i=0;i<segs.length;i++){var s=segs[i],y=i*ROW+2;\n"
    "    var bw=Math.max(40,(W-LBL-10)*s.total/maxT);\n"
    "    el('text',{x:0,y:y+12},svg,'dev '+s.device+' '+s.address+' '+fmt(s.total)+(s.expandable?' "
    "exp':''));\n"
    "    var g=el('g',{'class':'segment','data-address':s.address},svg);\n"
    "    el('rect',{x:LBL,y:y,width:bw,height:ROW-4,fill:'#f4f4f4',stroke:'#bbb'},g);\n"
    "    for(var j=0;j<s.blocks.length;j++){var b=s.blocks[j];\n"
    "      var r=el('rect',{x:LBL+bw*b[0]/s.total,y:y,width:Math.max(1,bw*b[1]/s.total),"
    "height:ROW-4,fill:COLORS[b[2]],stroke:'#fff','stroke-width':0.5,'class':'block "
    "'+NAMES[b[2]]},g);\n"
    "      el('title',{},r,NAMES[b[2]]+' '+fmt(b[1])+' at +'+b[0]);rects++;}\n"
    "  }\n"
    "}\n"
    "function drawLargest(host){\n"
    "  if(!D.largest.length){h('p',host,'No live blocks.').className='note';return;}\n"
    "  var t=h('table',host);t.className='blocks';var tr=h('tr',t);\n"
    "  ['address','size','requested','segment','stack'].forEach(function(c){h('th',tr,c);});\n"
    "  D.largest.forEach(function(b){var r=h('tr',t);h('td',r,b.address);h('td',r,fmt(b.size));\n"
    "    h('td',r,fmt(b.requested));h('td',r,b.segment);var c=h('td',r);\n"
    "    if(b.frames.length)h('pre',c,b.frames.join('\\n'));else h('span',c,'(no frames recorded)')"
    ".className='note';});\n"
    "}\n"
    "var tl=document.getElementById('timeline');\n"
    "var any=false;D.traces.forEach(function(tr){if(tr.t.length>1||tr.t.length==1){\n"
    "  h('div',tl,'device '+tr.device+': '+(tr.t.length-1)+' "
    "events');drawTimeline(tl,tr);any=true;}});\n"
    "if(!any)h('p',tl,'No history recorded (gca_record_history was off).').className='note';\n"
    "drawSegments(document.getElementById('segmap'));\n"
    "drawLargest(document.getElementById('largest'));\n"
    "document.body.setAttribute('data-gca-timeline-points',String(points));\n"
    "document.body.setAttribute('data-gca-segment-rects',String(rects));\n"
    "document.body.setAttribute('data-gca-drawn','1');\n"
    "})();\n"
    "</script>\n";

static void html_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
    case '<':
      fputs("&lt;", f);
      break;
    case '>':
      fputs("&gt;", f);
      break;
    case '&':
      fputs("&amp;", f);
      break;
    case '"':
      fputs("&quot;", f);
      break;
    default:
      fputc(*s, f);
    }
  }
}

static void hex_string(FILE *f, uint64_t v) {
  fprintf(f, "\"0x%" PRIx64 "\"", v);
}

/* The shortest of %.15g..%.17g that reads back as v; null when not finite. */
static void json_double(FILE *f, double v) {
  if (!isfinite(v)) {
    fputs("null", f);
    return;
  }
  char b[32];
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(b, sizeof(b), "%.*g", prec, v);
    if (strtod(b, NULL) == v)
      break;
  }
  fputs(b, f);
}

static void write_traces(FILE *f, const snapshot_t *s) {
  fputs("\"traces\":[", f);
  bool first = true;
  for (size_t i = 0; i < s->ntraces; i++) {
    const snap_trace_t *t = &s->traces[i];
    if (t->nevents == 0)
      continue;
    fprintf(f, "%s{\"device\":%lld,\"hasTimes\":%s,\"t\":[", first ? "" : ",", (long long)t->device,
            t->has_times ? "true" : "false");
    first = false;
    json_double(f, t->events[0].time_us);
    for (size_t j = 0; j < t->nevents; j++) {
      fputc(',', f);
      json_double(f, t->events[j].time_us);
    }
    fprintf(f, "],\"a\":[%lld", (long long)t->allocated_before);
    for (size_t j = 0; j < t->nevents; j++)
      fprintf(f, ",%lld", (long long)t->events[j].allocated_after);
    fprintf(f, "],\"r\":[%lld", (long long)t->reserved_before);
    for (size_t j = 0; j < t->nevents; j++)
      fprintf(f, ",%lld", (long long)t->events[j].reserved_after);
    fputs("]}", f);
  }
  fputc(']', f);
}

static void write_segments(FILE *f, const snapshot_t *s) {
  fputs("\"segments\":[", f);
  for (size_t i = 0; i < s->nsegments; i++) {
    const snap_segment_t *sg = &s->segments[i];
    fprintf(f, "%s{\"device\":%lld,\"address\":", i ? "," : "", (long long)sg->device);
    hex_string(f, sg->address);
    fprintf(f, ",\"total\":%" PRIu64 ",\"large\":%s,\"expandable\":%s,\"blocks\":[",
            (uint64_t)sg->total_size, sg->is_large ? "true" : "false",
            sg->is_expandable ? "true" : "false");
    for (size_t j = 0; j < sg->nblocks; j++) {
      const snap_block_t *b = &s->blocks[sg->first_block + j];
      fprintf(f, "%s[%" PRIu64 ",%" PRIu64 ",%d]", j ? "," : "",
              (uint64_t)(b->address >= sg->address ? b->address - sg->address : 0),
              (uint64_t)b->size, (int)b->state);
    }
    fputs("]}", f);
  }
  fputc(']', f);
}

static void write_largest(FILE *f, const snapshot_t *s, size_t top) {
  size_t idx[256];
  if (top > TOOL_ARRAY_SIZE(idx))
    top = TOOL_ARRAY_SIZE(idx);
  size_t n = gca__snapshot_largest(s, idx, top);
  fputs("\"largest\":[", f);
  for (size_t i = 0; i < n; i++) {
    const snap_block_t *b = &s->blocks[idx[i]];
    fputs(i ? ",{\"address\":" : "{\"address\":", f);
    hex_string(f, b->address);
    fprintf(f, ",\"size\":%" PRIu64 ",\"requested\":%" PRIu64 ",\"segment\":", (uint64_t)b->size,
            (uint64_t)b->requested_size);
    hex_string(f, s->segments[b->segment].address);
    fputs(",\"frames\":[", f);
    for (size_t j = 0; j < b->nframes; j++) {
      const snap_frame_t *fr = &b->frames[j];
      char line[1024];
      if (fr->filename[0])
        snprintf(line, sizeof(line), "%s (%s:%" PRId64 ")", fr->name[0] ? fr->name : "??",
                 fr->filename, fr->line);
      else
        snprintf(line, sizeof(line), "%s", fr->name[0] ? fr->name : "??");
      if (j)
        fputc(',', f);
      tool_json_string(f, line);
    }
    fputs("]}", f);
  }
  fputc(']', f);
}

/* The data island: one JSON object, written straight into the page. */
static void write_island(FILE *f, const snapshot_t *s, size_t top) {
  fputc('{', f);
  write_traces(f, s);
  fputc(',', f);
  write_segments(f, s);
  fputc(',', f);
  write_largest(f, s, top);
  fputc('}', f);
}

gca_status_t gca__snapshot_write_html(const snapshot_t *s, const char *title, size_t top, FILE *f) {
  char b[5][32];
  fputs(page_head, f);
  fputs("<title>gca snapshot: ", f);
  html_escape(f, title);
  fputs("</title></head>\n<body>\n<h1>gca snapshot</h1>\n<div class=\"note\">", f);
  html_escape(f, title);
  fprintf(f, " &mdash; %zu segments, %zu blocks</div>\n", s->nsegments, s->nblocks);
  fprintf(f,
          "<h2>Totals</h2>\n<table class=\"totals\">"
          "<tr><td>reserved</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>active_allocated</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>active_pending_free</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>inactive</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr>"
          "<tr><td>requested</td><td class=\"n\">%" PRIu64 "</td><td>%s</td></tr></table>\n",
          s->reserved, tool_format_size(s->reserved, b[0], sizeof(b[0])),
          s->by_state[SNAP_ACTIVE_ALLOCATED],
          tool_format_size(s->by_state[SNAP_ACTIVE_ALLOCATED], b[1], sizeof(b[1])),
          s->by_state[SNAP_ACTIVE_PENDING_FREE],
          tool_format_size(s->by_state[SNAP_ACTIVE_PENDING_FREE], b[2], sizeof(b[2])),
          s->by_state[SNAP_INACTIVE],
          tool_format_size(s->by_state[SNAP_INACTIVE], b[3], sizeof(b[3])), s->requested,
          tool_format_size(s->requested, b[4], sizeof(b[4])));
  fputs("<h2>Allocated and reserved bytes over the history</h2>\n"
        "<div class=\"legend\"><span style=\"background:#d9534f\"></span>allocated"
        "<span style=\"background:#337ab7\"></span>reserved</div>\n<div id=\"timeline\"></div>\n"
        "<h2>Segments</h2>\n<div class=\"legend\"><span style=\"background:#d9534f\"></span>"
        "active_allocated<span style=\"background:#f0ad4e\"></span>active_pending_free"
        "<span style=\"background:#9fd39f\"></span>inactive</div>\n<div id=\"segmap\"></div>\n"
        "<h2>Largest live blocks</h2>\n<div id=\"largest\"></div>\n"
        "<script type=\"application/json\" id=\"gca-data\">",
        f);
  write_island(f, s, top);
  fputs("</script>\n", f);
  fputs(page_script, f);
  fputs("</body></html>\n", f);
  if (fflush(f) != 0 || ferror(f))
    return tool_error(GCA_ERR_IO, "snapshot: writing the page failed");
  return GCA_OK;
}
