/* SPDX-License-Identifier: Apache-2.0 */
/* snapshot_page.js - the script of gca-snapshot's page (embedded into it by
 * embed_text at build time). It reads the data island #gca-data that
 * snapshot_html.c wrote, where every number was decided, and draws for each
 * snapshot's section the allocated/reserved timeline of each device, the
 * segment map and the largest live blocks; then it answers the pointer:
 *
 * - zoom and pan on the timelines: the wheel zooms about the pointer, a drag
 *   pans, keys + and - zoom about the middle, the arrows pan, 0 and the
 *   "Reset zoom" button show everything. Each timeline keeps its visible
 *   range in data-gca-view-start/-end (Note [Shared time axis]).
 * - hover: #gca-detail shows the block or the history event under the pointer
 *   (size, address, stream, the frames when recorded; an event's kind and
 *   time).
 * - a click on a segment lists its blocks under the segment map.
 *
 * When everything is drawn it sets data-gca-drawn="1" on <body>, with counts
 * of what it drew there (all snapshots) and on each section, which a headless
 * browser's DOM dump shows. Note [Self-test hook] drives the handlers.
 */
(function () {
'use strict';
var D = JSON.parse(document.getElementById('gca-data').textContent);
var NS = 'http://www.w3.org/2000/svg';
var STATE_COLORS = ['#d9534f', '#f0ad4e', '#9fd39f'];
var STATE_NAMES = ['active_allocated', 'active_pending_free', 'inactive'];
var PAIR = D.snapshots.length > 1;
/* Timeline geometry in SVG units (CSS pixels): the plot is [L, W-R] x [T, H-B]. */
var TL = {W: PAIR ? 660 : 900, H: 260, L: 80, R: 20, T: 12, B: 34};
var PLOT_W = TL.W - TL.L - TL.R;
var SEG_W = TL.W;
var ZOOM_PER_WHEEL_PIXEL = 0.002; /* the range scales by exp(deltaY * this) */
var KEY_ZOOM = 1.5;
var KEY_PAN = 0.1; /* of the visible width */

function el(tag, attrs, parent, text) {
  var e = document.createElementNS(NS, tag);
  for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
function h(tag, parent, text, cls) {
  var e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  if (parent) parent.appendChild(e);
  return e;
}
function fmt(b) {
  var u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], i = 0;
  while (Math.abs(b) >= 1024 && i < 4) { b /= 1024; i++; }
  return (i ? b.toFixed(2) : String(b)) + ' ' + u[i];
}
function bytes(b) { return b + ' (' + fmt(b) + ')'; }
function stackOf(id) { return id >= 0 && id < D.stacks.length ? D.stacks[id] : []; }
/* The first index i >= from with a[i] > v (a sorted), else a.length. */
function upperBound(a, v, from) {
  var lo = from || 0, hi = a.length;
  while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] > v) hi = m; else lo = m + 1; }
  return lo;
}
/* The first index i >= from with a[i] >= v, else a.length. */
function lowerBound(a, v, from) {
  var lo = from || 0, hi = a.length;
  while (lo < hi) { var m = (lo + hi) >> 1; if (a[m] >= v) hi = m; else lo = m + 1; }
  return lo;
}

/* ---- the detail panel ---- */

var detail = document.getElementById('gca-detail');
/* Shows rows of [label, value] and the frames beside the pointer at (x, y),
 * kept inside the window. The panel takes no pointer events, so it never
 * hides what is under the pointer. */
function showDetail(kind, rows, frames, x, y) {
  detail.textContent = '';
  detail.setAttribute('data-gca-detail', kind);
  var t = h('table', detail);
  rows.forEach(function (r) { var tr = h('tr', t); h('th', tr, r[0]); h('td', tr, String(r[1])); });
  if (frames.length) h('pre', detail, frames.join('\n'));
  else h('pre', detail, '(no frames recorded)', 'note');
  detail.hidden = false;
  var w = detail.offsetWidth, ht = detail.offsetHeight, left = x + 16, top = y + 16;
  if (left + w > window.innerWidth - 4) left = Math.max(4, x - 16 - w);
  if (top + ht > window.innerHeight - 4) top = Math.max(4, y - 16 - ht);
  detail.style.left = left + 'px';
  detail.style.top = top + 'px';
}
function hideDetail() {
  detail.hidden = true;
  detail.removeAttribute('data-gca-detail');
}

/* ---- zoom and pan ---- */

/* Note [Shared time axis]: a timeline's x is the time since its snapshot's
 * first recorded event (the earliest first event of its devices), not the
 * recorded time itself: two snapshots, say PyTorch's run and gca's replay of
 * it, were taken on different clocks, but both start at their first event.
 * Every timeline whose times are of one kind (microseconds, or event indices
 * for traces recorded without times) belongs to one group with one visible
 * range, so zooming or panning one zooms or pans the others: the devices of a
 * snapshot and the two snapshots side by side stay aligned. Indices and
 * microseconds are not comparable, so timelines of the two kinds get a group
 * each. A group spans [0, the longest of its timelines]. */
var groups = [], activeGroup = null, timelines = [];
function groupFor(hasTimes) {
  for (var i = 0; i < groups.length; i++) if (groups[i].hasTimes === hasTimes) return groups[i];
  var g = {hasTimes: hasTimes, span: 0, v0: 0, v1: 1, lines: []};
  groups.push(g);
  return g;
}
/* Shows [v0, v1] of group g, kept within [0, span] at no less than a
 * millionth of it; the width is kept when the range is moved back inside. */
function setView(g, v0, v1) {
  var w = v1 - v0, minW = g.span * 1e-6;
  if (!(w >= minW)) { var c = (v0 + v1) / 2; w = minW; v0 = c - w / 2; v1 = c + w / 2; }
  if (w >= g.span) { v0 = 0; v1 = g.span; }
  else if (v0 < 0) { v0 = 0; v1 = w; }
  else if (v1 > g.span) { v1 = g.span; v0 = g.span - w; }
  g.v0 = v0;
  g.v1 = v1;
  g.lines.forEach(function (tl) { tl.draw(); });
}
/* Scales the range by f about c: c stays where it is on the screen. */
function zoomAbout(g, c, f) { setView(g, c - (c - g.v0) * f, c + (g.v1 - c) * f); }
function panBy(g, d) { setView(g, g.v0 + d, g.v1 + d); }
function resetAll() { groups.forEach(function (g) { setView(g, 0, g.span); }); }

/* ---- a timeline ---- */

function Timeline(host, tr, origin) {
  var self = this, n = tr.t.length;
  this.tr = tr;
  this.rt = tr.t.map(function (t) { return t - origin; });
  this.group = groupFor(tr.hasTimes);
  this.group.span = Math.max(this.group.span, this.rt[n - 1], 1e-9);
  this.group.lines.push(this);
  this.ymax = 1;
  for (var i = 0; i < n; i++) this.ymax = Math.max(this.ymax, tr.a[i], tr.r[i]);
  var svg = this.svg = el('svg', {width: TL.W, height: TL.H, 'class': 'timeline',
    'data-device': tr.device, 'data-gca-points': n, 'data-gca-plot-left': TL.L,
    'data-gca-plot-width': PLOT_W, 'data-gca-plot-top': TL.T,
    'data-gca-plot-height': TL.H - TL.T - TL.B}, host);
  for (var k = 0; k <= 4; k++) {
    var v = this.ymax * k / 4, y = this.Y(v);
    el('line', {x1: TL.L, x2: TL.W - TL.R, y1: y, y2: y, stroke: '#eee'}, svg);
    el('text', {x: TL.L - 6, y: y + 4, 'text-anchor': 'end'}, svg, fmt(Math.round(v)));
  }
  el('line', {x1: TL.L, x2: TL.W - TL.R, y1: TL.H - TL.B, y2: TL.H - TL.B, stroke: '#999'}, svg);
  this.ticks = [];
  for (k = 0; k <= 4; k++) {
    this.ticks.push(el('text', {x: TL.L + PLOT_W * k / 4, y: TL.H - TL.B + 16,
      'text-anchor': k === 0 ? 'start' : k === 4 ? 'end' : 'middle'}, svg));
  }
  this.pathR = el('path', {fill: 'none', stroke: '#337ab7', 'stroke-width': 1.5, 'class': 'reserved'}, svg);
  this.pathA = el('path', {fill: 'none', stroke: '#d9534f', 'stroke-width': 1.5, 'class': 'allocated'}, svg);
  this.marker = el('line', {y1: TL.T, y2: TL.H - TL.B, stroke: '#444', 'stroke-dasharray': '3,3',
    visibility: 'hidden', 'class': 'marker'}, svg);
  this.markP = -1;
  svg.addEventListener('wheel', function (e) { self.onWheel(e); }, {passive: false});
  svg.addEventListener('mousedown', function (e) { self.onMouseDown(e); });
  svg.addEventListener('mousemove', function (e) { if (!drag) self.onHover(e); });
  svg.addEventListener('mouseleave', function () { self.unmark(); hideDetail(); });
  timelines.push(this);
}
Timeline.prototype.X = function (v) {
  var g = this.group;
  return TL.L + (v - g.v0) / (g.v1 - g.v0) * PLOT_W;
};
Timeline.prototype.Y = function (v) { return TL.H - TL.B - v / this.ymax * (TL.H - TL.T - TL.B); };
/* The fraction of the plot's width at clientX (outside [0, 1]: off the plot). */
Timeline.prototype.fraction = function (clientX) {
  var r = this.svg.getBoundingClientRect();
  return ((clientX - r.left) * TL.W / r.width - TL.L) / PLOT_W;
};
Timeline.prototype.timeText = function (v, width) {
  if (!this.tr.hasTimes) return 'event ' + (width < 40 ? v.toFixed(1) : Math.round(v));
  var digits = Math.min(6, Math.max(0, Math.ceil(-Math.log10(width / 1000 / 4)) + 1));
  return (v / 1000).toFixed(digits) + ' ms';
};
/* Redraws the two step lines over the group's visible range: from the last
 * point at or before its start (drawn from the left edge) to the last point
 * within it, and on to the right edge when more points follow. */
Timeline.prototype.draw = function () {
  var g = this.group, rt = this.rt, n = rt.length, self = this;
  var s = upperBound(rt, g.v0) - 1, e = upperBound(rt, g.v1);
  var empty = rt[n - 1] < g.v0 || rt[0] > g.v1;
  var x0 = s < 0 ? this.X(rt[0]) : TL.L;
  if (s < 0) s = 0;
  function path(vals) {
    if (empty) return '';
    var d = 'M' + x0.toFixed(1) + ',' + self.Y(vals[s]).toFixed(1);
    for (var i = s + 1; i < e; i++) d += 'H' + self.X(rt[i]).toFixed(1) + 'V' + self.Y(vals[i]).toFixed(1);
    if (e < n) d += 'H' + (TL.W - TL.R);
    return d;
  }
  this.pathR.setAttribute('d', path(this.tr.r));
  this.pathA.setAttribute('d', path(this.tr.a));
  for (var k = 0; k <= 4; k++) this.ticks[k].textContent = this.timeText(g.v0 + (g.v1 - g.v0) * k / 4, g.v1 - g.v0);
  this.svg.setAttribute('data-gca-view-start', String(g.v0));
  this.svg.setAttribute('data-gca-view-end', String(g.v1));
  this.svg.setAttribute('data-gca-visible-points', String(e - lowerBound(rt, g.v0)));
  if (this.markP >= 0) this.mark(this.markP);
};
Timeline.prototype.mark = function (p) {
  var g = this.group, t = this.rt[p];
  this.markP = p;
  if (t < g.v0 || t > g.v1) { this.marker.setAttribute('visibility', 'hidden'); return; }
  var x = this.X(t).toFixed(1);
  this.marker.setAttribute('x1', x);
  this.marker.setAttribute('x2', x);
  this.marker.setAttribute('visibility', 'visible');
};
Timeline.prototype.unmark = function () {
  this.markP = -1;
  this.marker.setAttribute('visibility', 'hidden');
};
Timeline.prototype.onWheel = function (e) {
  var fx = this.fraction(e.clientX), g = this.group;
  if (fx < 0 || fx > 1) return;
  e.preventDefault();
  activeGroup = g;
  var dy = e.deltaY * (e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? 400 : 1);
  zoomAbout(g, g.v0 + fx * (g.v1 - g.v0), Math.exp(dy * ZOOM_PER_WHEEL_PIXEL));
};
/* A drag pans: the time under the pointer follows it. */
var drag = null;
Timeline.prototype.onMouseDown = function (e) {
  if (e.button !== 0) return;
  e.preventDefault();
  var g = this.group, r = this.svg.getBoundingClientRect();
  activeGroup = g;
  drag = {tl: this, x: e.clientX, v0: g.v0, v1: g.v1, perPx: (g.v1 - g.v0) / (PLOT_W * r.width / TL.W)};
  this.svg.classList.add('dragging');
  this.unmark();
  hideDetail();
};
function endDrag() {
  if (drag) drag.tl.svg.classList.remove('dragging');
  drag = null;
}
window.addEventListener('mousemove', function (e) {
  if (!drag) return;
  if (!(e.buttons & 1)) { endDrag(); return; }
  var d = -(e.clientX - drag.x) * drag.perPx;
  setView(drag.tl.group, drag.v0 + d, drag.v1 + d);
});
window.addEventListener('mouseup', endDrag);
/* Hover: the event nearest in time to the pointer, when it is in view. */
Timeline.prototype.onHover = function (e) {
  var g = this.group, rt = this.rt, n = rt.length, tr = this.tr, fx = this.fraction(e.clientX);
  activeGroup = g;
  if (fx < 0 || fx > 1 || n < 2) { this.unmark(); hideDetail(); return; }
  var t = g.v0 + fx * (g.v1 - g.v0), p = lowerBound(rt, t, 1);
  if (p >= n || (p > 1 && t - rt[p - 1] <= rt[p] - t)) p--;
  if (rt[p] < g.v0 || rt[p] > g.v1) { this.unmark(); hideDetail(); return; }
  this.mark(p);
  var ev = tr.ev[p - 1];
  var when = tr.hasTimes ? (rt[p] / 1000).toFixed(3) + ' ms from the first event (time_us ' + tr.t[p] + ')'
                         : 'event ' + (p - 1) + ' (no times recorded)';
  var rows = [
    ['event', D.actions[ev[0]] + ' (#' + (p - 1) + ' on device ' + tr.device + ')'],
    ['time', when],
    ['size', bytes(ev[2])],
    ['address', ev[1]],
    ['stream', ev[3]],
    ['allocated after', bytes(tr.a[p])],
    ['reserved after', bytes(tr.r[p])]
  ];
  /* Events recorded in the same microsecond share one x: the first is shown. */
  var last = upperBound(rt, rt[p], p) - 1;
  if (last > p) rows.push(['at this time', (last - p + 1) + ' events, #' + (p - 1) + ' to #' + (last - 1)]);
  showDetail('event', rows, stackOf(ev[4]), e.clientX, e.clientY);
};

document.addEventListener('keydown', function (e) {
  if (e.ctrlKey || e.metaKey || e.altKey || !groups.length) return;
  var g = activeGroup || groups[0], w = g.v1 - g.v0, c = (g.v0 + g.v1) / 2;
  switch (e.key) {
  case '+': case '=': zoomAbout(g, c, 1 / KEY_ZOOM); break;
  case '-': case '_': zoomAbout(g, c, KEY_ZOOM); break;
  case 'ArrowLeft': panBy(g, -w * KEY_PAN); break;
  case 'ArrowRight': panBy(g, w * KEY_PAN); break;
  case '0': case 'Home': setView(g, 0, g.span); break;
  default: return;
  }
  e.preventDefault();
});

/* ---- the segment map ---- */

/* Draws the segments of one snapshot; returns how many block rectangles. */
function drawSegments(host, list, snap) {
  var segs = snap.segments, LBL = 220, ROW = 18, maxT = 1, rects = 0;
  for (var i = 0; i < segs.length; i++) maxT = Math.max(maxT, segs[i].total);
  var svg = el('svg', {width: SEG_W, height: Math.max(ROW, segs.length * ROW + 4), 'class': 'segments'}, host);
  for (i = 0; i < segs.length; i++) {
    var s = segs[i], y = i * ROW + 2, bw = Math.max(40, (SEG_W - LBL - 10) * s.total / maxT);
    el('text', {x: 0, y: y + 12}, svg, 'dev ' + s.device + ' ' + s.address + ' ' + fmt(s.total) +
       (s.expandable ? ' exp' : ''));
    var g = el('g', {'class': 'segment', 'data-address': s.address, 'data-index': i}, svg);
    el('rect', {x: LBL, y: y, width: bw, height: ROW - 4, fill: '#f4f4f4', stroke: '#bbb', 'class': 'bg'}, g);
    for (var j = 0; j < s.blocks.length; j++) {
      var b = s.blocks[j];
      el('rect', {x: LBL + bw * b[0] / s.total, y: y, width: Math.max(1, bw * b[1] / s.total),
        height: ROW - 4, fill: STATE_COLORS[b[2]], stroke: '#fff', 'stroke-width': 0.5,
        'class': 'block ' + STATE_NAMES[b[2]], 'data-address': b[3], 'data-index': j}, g);
      rects++;
    }
  }
  svg.addEventListener('mousemove', function (e) {
    var r = e.target.closest('rect.block');
    if (!r) { hideDetail(); return; }
    var s = segs[+r.parentNode.getAttribute('data-index')], b = s.blocks[+r.getAttribute('data-index')];
    showDetail('block', [
      ['block', STATE_NAMES[b[2]]],
      ['size', bytes(b[1])],
      ['requested', bytes(b[4])],
      ['address', b[3]],
      ['segment', s.address + ' + ' + b[0]],
      ['stream', s.stream],
      ['device', s.device]
    ], stackOf(b[5]), e.clientX, e.clientY);
  });
  svg.addEventListener('mouseleave', hideDetail);
  svg.addEventListener('click', function (e) {
    var g = e.target.closest('g.segment');
    if (!g) return;
    var old = svg.querySelector('g.segment.selected');
    if (old) old.classList.remove('selected');
    g.classList.add('selected');
    listBlocks(list, segs[+g.getAttribute('data-index')]);
  });
  return rects;
}
/* A clicked segment: its blocks, in address order as recorded. */
function listBlocks(list, s) {
  list.textContent = '';
  list.setAttribute('data-gca-segment', s.address);
  list.setAttribute('data-gca-blocks', String(s.blocks.length));
  h('p', list, 'Segment ' + s.address + ' on device ' + s.device + ': ' + bytes(s.total) + ', stream ' +
    s.stream + ', ' + (s.large ? 'large' : 'small') + (s.expandable ? ', expandable' : '') + ', ' +
    s.blocks.length + ' block' + (s.blocks.length === 1 ? '' : 's'));
  var t = h('table', list, undefined, 'blocks'), head = h('tr', t);
  ['address', 'size', 'state', 'stream'].forEach(function (c) { h('th', head, c); });
  s.blocks.forEach(function (b) {
    var r = h('tr', t, undefined, 'block-row');
    h('td', r, b[3]);
    h('td', r, bytes(b[1]), 'n');
    h('td', r, STATE_NAMES[b[2]]);
    h('td', r, s.stream);
  });
}

function drawLargest(host, snap) {
  if (!snap.largest.length) { h('p', host, 'No live blocks.', 'note'); return; }
  var t = h('table', host, undefined, 'blocks'), head = h('tr', t);
  ['address', 'size', 'requested', 'segment', 'stack'].forEach(function (c) { h('th', head, c); });
  snap.largest.forEach(function (b) {
    var r = h('tr', t);
    h('td', r, b.address);
    h('td', r, fmt(b.size));
    h('td', r, fmt(b.requested));
    h('td', r, b.segment);
    var c = h('td', r), frames = stackOf(b.stack);
    if (frames.length) h('pre', c, frames.join('\n'));
    else h('span', c, '(no frames recorded)', 'note');
  });
}

/* ---- the page ---- */

var sections = document.querySelectorAll('section.snapshot');
var allPoints = 0, allRects = 0;
D.snapshots.forEach(function (snap, si) {
  var sec = sections[si], host = sec.querySelector('.timelines'), points = 0;
  var origin = {};
  snap.traces.forEach(function (tr) {
    var k = String(tr.hasTimes);
    if (!(k in origin) || tr.t[0] < origin[k]) origin[k] = tr.t[0];
  });
  snap.traces.forEach(function (tr) {
    h('div', host, 'device ' + tr.device + ': ' + (tr.t.length - 1) + ' events');
    new Timeline(host, tr, origin[String(tr.hasTimes)]);
    points += tr.t.length;
  });
  if (!snap.traces.length) h('p', host, 'No history recorded (gca_record_history was off).', 'note');
  var rects = drawSegments(sec.querySelector('.segmap'), sec.querySelector('.seglist'), snap);
  drawLargest(sec.querySelector('.largest'), snap);
  sec.setAttribute('data-gca-timeline-points', String(points));
  sec.setAttribute('data-gca-segment-rects', String(rects));
  allPoints += points;
  allRects += rects;
});
resetAll();
document.getElementById('gca-reset').addEventListener('click', resetAll);
document.body.setAttribute('data-gca-timeline-points', String(allPoints));
document.body.setAttribute('data-gca-segment-rects', String(allRects));
document.body.setAttribute('data-gca-drawn', '1');

/* Note [Self-test hook]: a headless browser's DOM dump (chromium --headless
 * --dump-dom) shows the page as its scripts left it, with no pointer and no
 * keyboard. Opened as page.html#gca-selftest=STEP,STEP,... the page plays the
 * steps once it is drawn, as a user would: each finds where its target is on
 * the screen (scrolled into view), asks the browser what is at that point
 * (elementFromPoint) and dispatches real WheelEvent, MouseEvent and
 * KeyboardEvent objects to it, so the handlers, the hit testing and the
 * coordinate arithmetic all run as they do under a mouse. It records what it
 * did and hit, and the ranges the timeline's attributes showed after each
 * step, as "step.what=value" lines in a pre element #gca-selftest-log, and
 * sets data-gca-selftest on <body> to "ok" or "failed: why"; the dump shows
 * both.
 * Without the fragment nothing of it runs. Steps (@I: in snapshot I, default
 * the first; the timeline is the snapshot's first):
 *   zoom[:F]           the wheel, 300 pixels towards zooming in, at fraction F
 *                      (default 0.3) of the timeline's width
 *   pan[:DX]           a drag from the middle by DX pixels (default -100)
 *   keys               the keys +, ArrowRight, -, ArrowLeft, then a click on
 *                      "Reset zoom"
 *   hover-block:ADDR   the pointer over the middle of the block at ADDR
 *   hover-event:N      the pointer on the timeline at the time of event N
 *   click-segment:ADDR a click on the middle of the segment at ADDR */
function selfTest(spec) {
  var log = [];
  function rec(k, v) { log.push(k + '=' + v); }
  function section(i) {
    if (!sections[i]) throw new Error('no snapshot ' + i);
    return sections[i];
  }
  function timelineOf(i) {
    var svg = section(i).querySelector('svg.timeline');
    if (!svg) throw new Error('snapshot ' + i + ' has no timeline');
    return svg;
  }
  function num(e, a) { return parseFloat(e.getAttribute(a)); }
  function view(svg) { return svg.getAttribute('data-gca-view-start') + ',' + svg.getAttribute('data-gca-view-end'); }
  function byAddress(i, sel, addr) {
    var all = section(i).querySelectorAll(sel);
    for (var k = 0; k < all.length; k++) if (all[k].getAttribute('data-address') === addr) return all[k];
    throw new Error('no ' + sel + ' at ' + addr + ' in snapshot ' + i);
  }
  /* The screen point at fraction fx of the plot's width, halfway down it. */
  function plotPoint(svg, fx) {
    svg.scrollIntoView({block: 'center', inline: 'nearest'});
    var r = svg.getBoundingClientRect(), k = r.width / num(svg, 'width');
    return {x: r.left + (num(svg, 'data-gca-plot-left') + fx * num(svg, 'data-gca-plot-width')) * k,
            y: r.top + (num(svg, 'data-gca-plot-top') + num(svg, 'data-gca-plot-height') / 2) * k};
  }
  function middle(e) {
    e.scrollIntoView({block: 'center', inline: 'nearest'});
    var r = e.getBoundingClientRect();
    return {x: r.left + r.width / 2, y: r.top + r.height / 2};
  }
  /* "tag.class.class", and " in svg.class" for an element of a drawing. */
  function describe(t) {
    var c = t.getAttribute('class'), svg = t.closest('svg');
    var s = t.tagName.toLowerCase() + (c ? '.' + c.split(' ').join('.') : '');
    return s + (svg && svg !== t ? ' in svg.' + svg.getAttribute('class') : '');
  }
  /* Dispatches an event of `type` to whatever is at point p. */
  function fire(type, p, init) {
    var target = document.elementFromPoint(p.x, p.y);
    if (!target) throw new Error(type + ': nothing at ' + p.x + ',' + p.y);
    init = init || {};
    init.clientX = p.x;
    init.clientY = p.y;
    init.bubbles = true;
    init.cancelable = true;
    init.view = window;
    target.dispatchEvent(type === 'wheel' ? new WheelEvent(type, init) : new MouseEvent(type, init));
    return target;
  }
  var steps = {
    zoom: function (arg, i) {
      var svg = timelineOf(i), fx = arg ? parseFloat(arg) : 0.3, p = plotPoint(svg, fx);
      var v0 = num(svg, 'data-gca-view-start'), v1 = num(svg, 'data-gca-view-end');
      rec('zoom.before', view(svg));
      rec('zoom.cursor', String(v0 + fx * (v1 - v0)));
      rec('zoom.hit', describe(fire('wheel', p, {deltaY: -300, deltaMode: 0})));
      rec('zoom.after', view(svg));
    },
    pan: function (arg, i) {
      var svg = timelineOf(i), dx = arg ? parseFloat(arg) : -100, p = plotPoint(svg, 0.5);
      rec('pan.before', view(svg));
      rec('pan.hit', describe(fire('mousedown', p, {button: 0, buttons: 1})));
      fire('mousemove', {x: p.x + dx, y: p.y}, {button: 0, buttons: 1});
      fire('mouseup', {x: p.x + dx, y: p.y}, {button: 0, buttons: 0});
      rec('pan.after', view(svg));
    },
    keys: function (arg, i) {
      var svg = timelineOf(i);
      rec('keys.before', view(svg));
      ['+', 'ArrowRight', '-', 'ArrowLeft'].forEach(function (key) {
        document.body.dispatchEvent(new KeyboardEvent('keydown', {key: key, bubbles: true, cancelable: true}));
        rec('keys.' + key, view(svg));
      });
      fire('click', middle(document.getElementById('gca-reset')), {button: 0});
      rec('keys.reset', view(svg));
    },
    'hover-block': function (arg, i) {
      rec('hover-block.hit', describe(fire('mousemove', middle(byAddress(i, 'rect.block', arg)))));
    },
    'hover-event': function (arg, i) {
      var svg = timelineOf(i), n = parseInt(arg, 10), tl = null;
      for (var k = 0; k < timelines.length; k++) if (timelines[k].svg === svg) tl = timelines[k];
      if (!(n >= 0 && n + 1 < tl.rt.length)) throw new Error('no event ' + arg);
      var v0 = num(svg, 'data-gca-view-start'), v1 = num(svg, 'data-gca-view-end'), t = tl.rt[n + 1];
      if (t < v0 || t > v1) throw new Error('event ' + n + ' at ' + t + ' is outside the visible range');
      rec('hover-event.time', String(t));
      rec('hover-event.hit', describe(fire('mousemove', plotPoint(svg, (t - v0) / (v1 - v0)))));
    },
    'click-segment': function (arg, i) {
      var p = middle(byAddress(i, 'g.segment', arg));
      fire('mousedown', p, {button: 0, buttons: 1});
      fire('mouseup', p, {button: 0});
      rec('click-segment.hit', describe(fire('click', p, {button: 0})));
    }
  };
  var result = 'ok';
  try {
    spec.split(',').forEach(function (step) {
      var at = step.split('@'), i = at.length > 1 ? parseInt(at[1], 10) : 0;
      var colon = at[0].indexOf(':');
      var name = colon < 0 ? at[0] : at[0].slice(0, colon), arg = colon < 0 ? '' : at[0].slice(colon + 1);
      if (!steps.hasOwnProperty(name)) throw new Error('unknown step ' + name);
      steps[name](arg, i);
    });
  } catch (err) {
    result = 'failed: ' + err.message;
  }
  h('pre', document.body, log.join('\n')).id = 'gca-selftest-log';
  document.body.setAttribute('data-gca-selftest', result);
}
var m = /^#gca-selftest=(.*)$/.exec(location.hash);
if (m) selfTest(decodeURIComponent(m[1]));
})();
