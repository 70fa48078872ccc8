"""The stylesheet and script of the flame graph page, kept apart from the Python logic.

They are Python strings (not package data files) so the page needs nothing but this
module to build, and inlined into every page so it opens with no network access.

Safety rule the script follows: profile data reaches the page only as JSON inside a
``<script type="application/json">`` element (with ``<``, ``>`` and ``&`` escaped
by the writer) and is put into the document only through ``textContent`` and
``setAttribute`` — never ``innerHTML`` — so a function named ``<script>`` is text.
"""

CSS = r"""
.ss-root { font: 13px/1.35 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
  background: #fff; }
.ss-root * { box-sizing: border-box; }
.ss-root h1 { font-size: 17px; margin: 0 0 4px; font-weight: 600; }
.ss-summary { color: #444; margin-bottom: 8px; }
.ss-controls { display: flex; flex-wrap: wrap; gap: 6px 14px; align-items: center;
  margin-bottom: 8px; }
.ss-controls label { color: #555; }
.ss-controls select, .ss-controls input, .ss-controls button { font: inherit; padding: 2px 6px; }
.ss-controls input[type=search] { width: 16em; }
.ss-status { color: #555; min-height: 1.4em; margin-bottom: 4px; }
.ss-main { display: flex; gap: 12px; align-items: flex-start; }
.ss-graph { flex: 3 1 480px; min-width: 0; position: relative; }
.ss-side { flex: 2 1 320px; min-width: 0; max-height: 80vh; overflow: auto;
  border-left: 1px solid #ddd; padding-left: 10px; }
.ss-side h2 { font-size: 14px; margin: 0 0 6px; }
.ss-flame { display: block; width: 100%; }
.ss-box rect { stroke: #fff; stroke-width: 0.5; cursor: pointer; }
.ss-box text { font-size: 11px; fill: #111; pointer-events: none;
  font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.ss-box.ss-match rect { fill: #e040fb !important; }
.ss-box.ss-picked rect { stroke: #000; stroke-width: 1.5; }
.ss-box.ss-dim rect { opacity: 0.35; }
.ss-tip { position: fixed; z-index: 10; pointer-events: none; background: #fffbe6;
  border: 1px solid #c9b458; border-radius: 3px; padding: 5px 8px; max-width: 46em;
  box-shadow: 0 2px 6px rgba(0,0,0,.2); display: none; }
.ss-tip b { font-family: ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-all; }
.ss-tip table { border-collapse: collapse; margin-top: 3px; }
.ss-tip td { padding: 0 8px 0 0; vertical-align: top; }
.ss-empty { padding: 28px; text-align: center; color: #666; border: 1px dashed #bbb;
  font-size: 15px; }
.ss-table { border-collapse: collapse; width: 100%; font-size: 12px; }
.ss-table td { padding: 1px 5px; white-space: nowrap; }
.ss-table td.ss-name { white-space: normal; word-break: break-all;
  font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.ss-table tbody.ss-group { border-top: 1px solid #999; }
.ss-table th { text-align: left; font-weight: 600; color: #444; }
.ss-table tr.ss-node td { background: #f1f1f1; font-weight: 600; }
.ss-table tr.ss-edge td { color: #444; }
.ss-table tr.ss-edge td.ss-name { padding-left: 2.2em; }
.ss-table tr.ss-node.ss-picked td { background: #ffe082; }
.ss-table .ss-num { text-align: right; font-variant-numeric: tabular-nums; }
.ss-table .ss-link { cursor: pointer; text-decoration: underline dotted; }
.ss-src { color: #777; font-weight: normal; }
.ss-note { color: #777; font-size: 12px; margin: 4px 0; }
"""

JS = r"""
(function () {
  'use strict';
  var ROW = 18;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function svgEl(tag) { return document.createElementNS('http://www.w3.org/2000/svg', tag); }

  function fmtBytes(b) {  // decimal units, as the text report: 1 KB = 1000 bytes
    if (b === 0) return '0';
    var units = [[1e9, ' GB'], [1e6, ' MB'], [1e3, ' KB']];
    for (var i = 0; i < units.length; i++) {
      var v = b / units[i][0];
      if (v >= 1) return v.toFixed(v >= 100 ? 0 : v >= 10 ? 1 : 2) + units[i][1];
    }
    return Math.round(b) + ' B';
  }
  function fmtSeconds(s) {
    if (s === 0) return '0';
    if (s >= 1) return s.toFixed(s >= 100 ? 0 : 2) + ' s';
    if (s >= 1e-3) return (s * 1e3).toFixed(s >= 0.1 ? 0 : 1) + ' ms';
    return (s * 1e6).toFixed(0) + ' \u00b5s';
  }
  function shortSrc(src) {  // "/long/path/to/mod.py:12" -> "mod.py:12" (full text in a tooltip)
    var cut = Math.max(src.lastIndexOf('/'), src.lastIndexOf('\\'));
    return cut >= 0 ? src.slice(cut + 1) : src;
  }
  function pct(part, whole) { return whole > 0 ? (100 * part / whole).toFixed(1) + '%' : '-'; }

  function hue(name) {  // a stable warm colour per function name
    var h = 0;
    for (var i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return 'hsl(' + (h % 50) + ',' + (70 + (h >> 8) % 25) + '%,' + (58 + (h >> 16) % 12) + '%)';
  }

  function Flame(root) {
    var data = JSON.parse(root.querySelector('script.ss-data').textContent);
    var fmtTime = data.unit === 'bytes' ? fmtBytes : fmtSeconds;  // allocation profiles: bytes
    var q = function (sel) { return root.querySelector(sel); };
    var n = data.parent.length;
    var kids = [];
    for (var i = 0; i < n; i++) kids.push([]);
    for (i = 1; i < n; i++) kids[data.parent[i]].push(i);
    var depth = new Int32Array(n);
    for (i = 1; i < n; i++) depth[i] = depth[data.parent[i]] + 1;
    var state = {thread: 'all', metric: data.clock, mark: '', view: 'flame', zoom: 0,
                 search: '', picked: -1};
    var self = new Float64Array(n), total = new Float64Array(n);
    var svg = q('svg.ss-flame'), tip = q('.ss-tip'), status = q('.ss-status');
    var empty = q('.ss-graph .ss-empty');
    var column = {samples: 3, cpu: 4, wall: 5};

    function rowMatches(r) {
      if (state.thread !== 'all' && String(r[0]) !== state.thread) return false;
      if (state.mark !== '') {
        var parts = state.mark.split('\u0000'), k = +parts[0], v = parts[1];
        var set = data.markSets[r[2]] || [];
        for (var j = 0; j < set.length; j++) {
          if (set[j][k] !== null) return set[j][k] === v;  // the innermost extent with key k
        }
        return false;
      }
      return true;
    }

    function aggregate() {
      threadCache = {};
      self.fill(0);
      var col = column[state.metric];
      for (var j = 0; j < data.rows.length; j++) {
        var r = data.rows[j];
        if (rowMatches(r)) self[r[1]] += r[col];
      }
      total.set(self);
      for (var k = n - 1; k > 0; k--) total[data.parent[k]] += total[k];
      for (k = 0; k < n; k++) kids[k].sort(function (a, b) { return total[b] - total[a]; });
      if (state.zoom && !(total[state.zoom] > 0)) state.zoom = 0;
    }

    function fmt(v) { return state.metric === 'samples' ? String(Math.round(v)) : fmtTime(v); }
    function fnOf(node) { return data.functions[data.func[node]]; }
    function label(node) { return node === 0 ? rootLabel() : fnOf(node)[0]; }
    function rootLabel() {
      if (state.thread === 'all') return 'all threads';
      var t = data.threads[+state.thread];
      return t ? t[1] : 'all threads';
    }

    function layout() {
      var boxes = [], width = Math.max(svg.clientWidth || root.clientWidth || 800, 200);
      var z = state.zoom, a = data.parent[z], chain = [];
      while (z !== 0 && a !== undefined) { chain.push(a); if (a === 0) break; a = data.parent[a]; }
      chain.forEach(function (c) { boxes.push({node: c, x: 0, w: width, d: depth[c], anc: true}); });
      var maxD = depth[state.zoom];
      // depth-first with an explicit stack, not recursion: a stack thousands of frames
      // deep must not overflow the browser's call stack (a blank page before)
      var todo = total[state.zoom] > 0 ? [[state.zoom, 0, width]] : [];
      while (todo.length) {
        var item = todo.pop(), node = item[0], x = item[1], w = item[2];
        if (w < 0.5) continue;
        boxes.push({node: node, x: x, w: w, d: depth[node], anc: false});
        if (depth[node] > maxD) maxD = depth[node];
        var t = total[node], cx = x, next = [];
        if (!(t > 0)) continue;
        kids[node].forEach(function (c) {
          if (total[c] > 0) { var cw = w * total[c] / t; next.push([c, cx, cw]); cx += cw; }
        });
        for (var k = next.length - 1; k >= 0; k--) todo.push(next[k]);  // first child first
      }
      return {boxes: boxes, width: width, maxD: maxD};
    }

    function draw() {
      while (svg.firstChild) svg.removeChild(svg.firstChild);
      var has = total[0] > 0;
      svg.style.display = has ? '' : 'none';
      empty.style.display = has ? 'none' : '';
      if (!has) {
        empty.textContent = data.rows.length ? 'No samples for this selection.' :
          'No samples: the profile is empty.';
        svg.setAttribute('data-boxes', '0');
        updateStatus(); return;
      }
      var L = layout(), H = (L.maxD + 1) * ROW;
      svg.setAttribute('height', H);
      svg.setAttribute('viewBox', '0 0 ' + L.width + ' ' + H);
      var re = searchRegex();
      L.boxes.forEach(function (b) {
        var g = svgEl('g'), r = svgEl('rect'), y = state.view === 'flame' ? H - (b.d + 1) * ROW : b.d * ROW;
        g.setAttribute('class', 'ss-box' + (b.anc ? ' ss-dim' : '') +
          (re && b.node && matches(re, b.node) ? ' ss-match' : '') +
          (b.node && data.func[b.node] === state.picked ? ' ss-picked' : ''));
        g.setAttribute('data-node', b.node);
        g.setAttribute('data-fn', label(b.node));
        r.setAttribute('x', b.x.toFixed(2)); r.setAttribute('y', y);
        r.setAttribute('width', Math.max(b.w - 0.5, 0.5).toFixed(2)); r.setAttribute('height', ROW - 1);
        r.setAttribute('fill', b.node === 0 ? '#d8d8d8' : hue(label(b.node)));
        g.appendChild(r);
        var chars = Math.floor((b.w - 6) / 6.6);
        if (chars >= 3) {
          var t = svgEl('text'), s = label(b.node);
          t.setAttribute('x', (b.x + 3).toFixed(2)); t.setAttribute('y', y + ROW - 5);
          t.textContent = s.length > chars ? s.slice(0, chars - 2) + '..' : s;
          g.appendChild(t);
        }
        svg.appendChild(g);
      });
      svg.setAttribute('data-boxes', String(L.boxes.length));
      updateStatus();
    }

    function searchRegex() {
      if (!state.search) return null;
      try { return new RegExp(state.search, 'i'); }
      catch (e) { return new RegExp(state.search.replace(/[.*+?^${}()|[\]\\]/g, '\\$&'), 'i'); }
    }
    function matches(re, node) { var f = fnOf(node); return re.test(f[0]) || re.test(f[1] || ''); }

    function updateStatus() {
      var parts = [];
      var base = total[0];
      if (state.zoom) parts.push('Zoomed on ' + label(state.zoom) + ': ' + fmt(total[state.zoom]) +
                                 ' (' + pct(total[state.zoom], base) + '). Click a faded caller, or Reset, to zoom out.');
      var re = searchRegex();
      if (re) {
        var hit = 0, todo = [[0, false]];
        while (todo.length) {  // iterative, like layout(): deep stacks must not overflow
          var item = todo.pop(), node = item[0], m = node !== 0 && matches(re, node);
          if (m && !item[1]) hit += total[node];
          for (var k = 0; k < kids[node].length; k++) todo.push([kids[node][k], item[1] || m]);
        }
        parts.push('Search matched ' + fmt(hit) + ' (' + pct(hit, base) + ').');
      }
      status.textContent = parts.join(' ');
    }

    var threadCache = {};
    function threadsOf(node) {  // cached per node until the selection changes
      if (threadCache[node]) return threadCache[node];
      var names = {}, col = column[state.metric];
      data.rows.forEach(function (r) {
        if (!rowMatches(r) || !(r[col] > 0 || r[3] > 0)) return;
        for (var x = r[1]; x; x = data.parent[x]) if (x === node) { names[r[0]] = 1; return; }
        if (node === 0) names[r[0]] = 1;
      });
      return (threadCache[node] = Object.keys(names).map(function (t) { return data.threads[+t][1]; }));
    }

    function showTip(node, ev) {
      while (tip.firstChild) tip.removeChild(tip.firstChild);
      var base = total[0];
      tip.appendChild(el('b', null, label(node)));
      var tbl = el('table');
      function line(k, v) { var tr = el('tr'); tr.appendChild(el('td', null, k)); tr.appendChild(el('td', null, v)); tbl.appendChild(tr); }
      if (node) {
        var f = fnOf(node);
        line('where', (f[1] || '?') + ':' + (f[2] || '?'));
        line('self', fmt(self[node]) + '  (' + pct(self[node], base) + ')');
      }
      line('total', fmt(total[node]) + '  (' + pct(total[node], base) + ')');
      if (state.zoom && node !== state.zoom) line('of zoom', pct(total[node], total[state.zoom]));
      var th = threadsOf(node);
      line(th.length > 1 ? 'threads' : 'thread', th.join(', '));
      tip.appendChild(tbl);
      tip.style.display = 'block';
      moveTip(ev);
    }
    function moveTip(ev) {
      var x = ev.clientX + 14, y = ev.clientY + 14, w = tip.offsetWidth, h = tip.offsetHeight;
      if (x + w > window.innerWidth) x = Math.max(0, ev.clientX - w - 14);
      if (y + h > window.innerHeight) y = Math.max(0, ev.clientY - h - 14);
      tip.style.left = x + 'px'; tip.style.top = y + 'px';
    }
    function nodeAt(ev) {
      var g = ev.target.closest ? ev.target.closest('g.ss-box') : null;
      return g ? +g.getAttribute('data-node') : -1;
    }

    svg.addEventListener('mousemove', function (ev) {
      var node = nodeAt(ev);
      if (node < 0) { tip.style.display = 'none'; return; }
      showTip(node, ev);
    });
    svg.addEventListener('mouseleave', function () { tip.style.display = 'none'; });
    svg.addEventListener('click', function (ev) {
      var node = nodeAt(ev);
      if (node < 0) return;
      state.zoom = node === state.zoom ? data.parent[node] : node;
      if (node) pick(data.func[node], true);
      draw();
    });

    // -- controls -------------------------------------------------------------
    var sel = q('.ss-thread');
    data.threads.forEach(function (t) {
      var o = el('option', null, t[1] + ' (' + t[2] + ' ' + t[0] + ')');
      o.value = String(t[0]); sel.appendChild(o);
    });
    sel.addEventListener('change', function () { state.thread = sel.value; aggregate(); draw(); renderTable(); });
    var msel = q('.ss-metric');
    msel.value = state.metric;
    msel.addEventListener('change', function () { state.metric = msel.value; aggregate(); draw(); renderTable(); });
    var ksel = q('.ss-mark');
    if (data.keys.length) {
      var seen = {};
      data.markSets.forEach(function (set) {
        data.keys.forEach(function (key, k) {
          for (var j = 0; j < set.length; j++) if (set[j][k] !== null) {
            var id = k + '\u0000' + set[j][k];
            if (!seen[id]) {
              seen[id] = 1;
              var o = el('option', null, key + ' = ' + set[j][k]); o.value = id; ksel.appendChild(o);
            }
          }
        });
      });
      ksel.addEventListener('change', function () { state.mark = ksel.value; aggregate(); draw(); });
    } else {
      ksel.parentNode.style.display = 'none';
    }
    q('.ss-view').addEventListener('change', function (ev) { state.view = ev.target.value; draw(); });
    var search = q('.ss-search');
    search.addEventListener('input', function () { state.search = search.value; draw(); });
    q('.ss-reset').addEventListener('click', function () {
      state.zoom = 0; state.search = ''; search.value = ''; pick(-1, false); draw();
    });
    window.addEventListener('resize', function () { draw(); });

    // -- Racket's caller/callee table -----------------------------------------
    var side = q('.ss-side-body');
    function tableFor() {
      var t = data.tables || {};
      var clock = state.metric === 'wall' ? 'wall' : 'cpu';
      var own = t[clock + ':' + state.thread];
      if (own) return {table: own, note: ''};
      var all = t[clock + ':all'];
      var withSamples = {};
      data.rows.forEach(function (r) { withSamples[r[0]] = 1; });
      var note = Object.keys(withSamples).length > 1 ?
        'Table for all threads: per-thread tables are made for a few threads only. ' : '';
      return all ? {table: all, note: note} : null;
    }
    function renderTable() {
      if (!side) return;
      while (side.firstChild) side.removeChild(side.firstChild);
      var found = tableFor(), tb = found && found.table;
      if (!tb) {
        side.appendChild(el('p', 'ss-note', !data.rows.length ? 'No samples.' : data.tables ?
          'No caller/callee table for this selection.' : 'The caller/callee table was not computed.'));
        return;
      }
      var note = (state.metric === 'samples' ? (data.unit === 'bytes' ? 'Numbers are bytes allocated. ' :
        'Times are CPU time. ') : '') + found.note;
      if (note) side.appendChild(el('p', 'ss-note', note));
      if (!tb.nodes.length) { side.appendChild(el('p', 'ss-empty', 'No samples.')); return; }
      var tbl = el('table', 'ss-table'), thead = el('thead'), head = el('tr');
      ['idx', 'total', 'self', 'name (\u2190 caller, \u2192 callee)', 'local'].forEach(function (h) { head.appendChild(el('th', null, h)); });
      thead.appendChild(head); tbl.appendChild(thead);
      var T = tb.total;
      function edgeRow(e, kind) {
        var tr = el('tr', 'ss-edge');
        tr.appendChild(el('td', 'ss-num', e[0] >= 0 ? '[' + e[0] + ']' : ''));
        tr.appendChild(el('td', 'ss-num', fmtTime(e[1])));
        tr.appendChild(el('td'));
        var name = el('td', 'ss-name' + (e[0] >= 0 ? ' ss-link' : ''), (kind === 'caller' ? '\u2190 ' : '\u2192 ') + e[2]);
        if (e[0] >= 0) name.addEventListener('click', function () { jump(e[0]); });
        tr.appendChild(name);
        tr.appendChild(el('td', 'ss-num', e[3]));
        return tr;
      }
      tb.nodes.forEach(function (nd) {
        // nd: [idx, name, src, total, self, fid, callers, callees]; callers above, callees below
        var group = el('tbody', 'ss-group');
        nd[6].forEach(function (e) { group.appendChild(edgeRow(e, 'caller')); });
        var tr = el('tr', 'ss-node' + (nd[5] === state.picked ? ' ss-picked' : ''));
        tr.setAttribute('data-idx', nd[0]); tr.setAttribute('data-fid', nd[5]);
        tr.appendChild(el('td', 'ss-num', '[' + nd[0] + ']'));
        tr.appendChild(el('td', 'ss-num', fmtTime(nd[3]) + ' ' + pct(nd[3], T)));
        tr.appendChild(el('td', 'ss-num', fmtTime(nd[4]) + ' ' + pct(nd[4], T)));
        var name = el('td', 'ss-name ss-link', nd[1]);
        if (nd[2]) {
          var src = el('span', 'ss-src', shortSrc(nd[2]));
          src.setAttribute('title', nd[2]);
          name.appendChild(document.createTextNode(' ')); name.appendChild(src);
        }
        name.addEventListener('click', function () { pick(nd[5], false); draw(); });
        tr.appendChild(name); tr.appendChild(el('td'));
        group.appendChild(tr);
        nd[7].forEach(function (e) { group.appendChild(edgeRow(e, 'callee')); });
        tbl.appendChild(group);
      });
      side.appendChild(tbl);
    }
    function jump(idx) {
      var tr = side && side.querySelector('tr[data-idx="' + idx + '"]');
      if (tr) { pick(+tr.getAttribute('data-fid'), true); draw(); }
    }
    function pick(fid, scroll) {
      state.picked = fid;
      if (!side) return;
      var rows = side.querySelectorAll('tr.ss-node'), target = null;
      for (var j = 0; j < rows.length; j++) {
        var on = +rows[j].getAttribute('data-fid') === fid;
        rows[j].classList.toggle('ss-picked', on);
        if (on && !target) target = rows[j];
      }
      if (target && scroll) {
        var group = target.parentNode;  // the tbody: show the callers above the row too
        side.scrollTop += group.getBoundingClientRect().top - side.getBoundingClientRect().top - 30;
      }
    }

    aggregate(); draw(); renderTable();
    root.setAttribute('data-ready', '1');
  }

  var roots = document.querySelectorAll('.ss-root:not([data-ready])');
  for (var r = 0; r < roots.length; r++) Flame(roots[r]);
})();
"""
