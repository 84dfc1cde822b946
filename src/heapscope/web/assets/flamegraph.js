// heapscope flame graph viewer: draws a call tree on a canvas.
// Every name comes from untrusted binaries or JIT maps: it is only ever shown through
// textContent or canvas fillText, never parsed as markup.
//
// window.heapscopeFlame.mount(data, {prefix}) draws the tree `data` (the JSON of
// heapscope.render.flamegraph.flamegraph_data) into the elements whose ids are prefix +
// title, type, search, invert, reset, total, match, crumbs, chart, flame, tooltip, details
// (and, when the page has it, orient: a select of "icicle", the root on top, or "flame",
// the root at the bottom), and returns a handle (frames, zoomName, nodeCount, redraw,
// destroy). A page that embeds
// its data in <script id="heapscope-data"> (the static flame graph file) is drawn at once,
// with the unprefixed ids, and gets the read-only view window.heapscopeFlamegraph.
(function () {
  'use strict';

  var KIND_TEXT = {own: "the program's own", library: 'language runtime / standard library',
                   dependency: 'third-party library', wrapper: 'allocation wrapper'};
  var ROW = 18;
  var FONT = '12px ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace';

  function mount(data, opts) {
    var prefix = (opts && opts.prefix) || '';
    function byId(id) { return document.getElementById(prefix + id); }
    // Every listener is kept, so destroy() leaves the elements as it found them.
    var listeners = [];
    function on(target, type, fn) {
      target.addEventListener(type, fn);
      listeners.push([target, type, fn]);
    }
    var S = data.strings;
    var NT = data.types.length;
    var DIFF = !!data.diff;
    var KINDS = data.kinds || [''];

    // ---------------------------------------------------------------- trees

    // Build a tree object from parallel arrays; parents always precede children.
    function makeTree(parent, name, file, line, module, inl, kind, self, selfBase) {
      var n = parent.length;
      var total = [], base = null, t, k;
      for (t = 0; t < NT; t++) {
        var col = Float64Array.from(self[t]);
        for (k = n - 1; k > 0; k--) col[parent[k]] += col[k];
        total.push(col);
      }
      if (selfBase) {
        base = [];
        for (t = 0; t < NT; t++) {
          var bc = Float64Array.from(selfBase[t]);
          for (k = n - 1; k > 0; k--) bc[parent[k]] += bc[k];
          base.push(bc);
        }
      }
      // Children in CSR form.
      var count = new Int32Array(n + 1);
      for (k = 1; k < n; k++) count[parent[k] + 1]++;
      for (k = 0; k < n; k++) count[k + 1] += count[k];
      var kids = new Int32Array(Math.max(n - 1, 0));
      var fill = count.slice(0, n);
      for (k = 1; k < n; k++) kids[fill[parent[k]]++] = k;
      var depth = new Int32Array(n), maxDepth = 0;
      for (k = 1; k < n; k++) {
        depth[k] = depth[parent[k]] + 1;
        if (depth[k] > maxDepth) maxDepth = depth[k];
      }
      return {n: n, parent: parent, name: name, file: file, line: line, module: module,
              inl: inl, kind: kind, self: self, selfBase: selfBase, total: total, base: base,
              start: count, kids: kids, depth: depth, maxDepth: maxDepth,
              weight: null, sortedFor: -1};
    }

    function loadTree(raw) {
      var n = raw.n.length, k;
      var parent = new Int32Array(n);
      parent[0] = -1;
      for (k = 1; k < n; k++) parent[k] = k - raw.p[k];
      var inl = new Uint8Array(n);
      for (k = 0; k < raw.i.length; k++) inl[raw.i[k]] = 1;
      var kind = raw.k ? Uint8Array.from(raw.k) : new Uint8Array(n);
      return makeTree(parent, Int32Array.from(raw.n), Int32Array.from(raw.f),
                      Int32Array.from(raw.l), Int32Array.from(raw.m), inl, kind,
                      raw.s, raw.sb || null);
    }

    // The callers' view: stacks read from the allocating frame back to main, built from the
    // self values (what stacks ending exactly at a node hold).
    function invertTree(tr) {
      var parent = [-1], name = [tr.name[0]], file = [0], line = [0], module = [0], inl = [0];
      var kind = [0];
      var self = [], selfBase = tr.selfBase ? [] : null, t;
      for (t = 0; t < NT; t++) { self.push([0]); if (selfBase) selfBase.push([0]); }
      var index = new Map();
      var path = [];
      for (var k = 1; k < tr.n; k++) {
        var any = false;
        for (t = 0; t < NT && !any; t++) {
          if (tr.self[t][k] || (selfBase && tr.selfBase[t][k])) any = true;
        }
        if (!any) continue;
        var node = 0;
        path.length = 0;
        for (var j = k; j > 0; j = tr.parent[j]) {
          var key = node * 4294967296 + tr.name[j];
          var c = index.get(key);
          if (c === undefined) {
            c = parent.length;
            index.set(key, c);
            parent.push(node); name.push(tr.name[j]); file.push(tr.file[j]);
            line.push(tr.line[j]); module.push(tr.module[j]); inl.push(tr.inl[j]);
            kind.push(tr.kind[j]);
            for (t = 0; t < NT; t++) { self[t].push(0); if (selfBase) selfBase[t].push(0); }
          } else if (line[c] !== tr.line[j]) {
            line[c] = 0;
          }
          node = c;
          path.push(c);
        }
        // The values belong to the deepest node of the inverted path (the stack's outermost
        // caller): subtree sums then give every node on the path the stack's value.
        for (t = 0; t < NT; t++) {
          self[t][node] += tr.self[t][k];
          if (selfBase) selfBase[t][node] += tr.selfBase[t][k];
        }
      }
      return makeTree(Int32Array.from(parent), Int32Array.from(name), Int32Array.from(file),
                      Int32Array.from(line), Int32Array.from(module), Uint8Array.from(inl),
                      Uint8Array.from(kind), self, selfBase);
    }

    // Layout weights: a node's value, or for a diff max(new, base) and at least its children,
    // so every frame that existed in either profile stays visible and children fit.
    function computeWeights(tr, t) {
      var n = tr.n, w = new Float64Array(n), k;
      if (!DIFF) {
        for (k = 0; k < n; k++) w[k] = Math.max(tr.total[t][k], 0);
      } else {
        var sum = new Float64Array(n);
        for (k = n - 1; k >= 0; k--) {
          w[k] = Math.max(tr.total[t][k], tr.base[t][k], sum[k]);
          if (k > 0) sum[tr.parent[k]] += w[k];
        }
      }
      tr.weight = w;
      // Widest children first.
      for (k = 0; k < n; k++) {
        var a = tr.start[k], b = tr.start[k + 1];
        if (b - a > 1) {
          var sub = Array.prototype.slice.call(tr.kids, a, b);
          sub.sort(function (x, y) { return w[y] - w[x] || x - y; });
          for (var j = 0; j < sub.length; j++) tr.kids[a + j] = sub[j];
        }
      }
      tr.sortedFor = t;
    }

    function value(tr, t, k) {
      return DIFF ? tr.total[t][k] - tr.base[t][k] : tr.total[t][k];
    }

    // ---------------------------------------------------------------- formatting

    function groups(x) {
      var s = String(Math.round(Math.abs(x)));
      var out = '';
      while (s.length > 3) { out = ',' + s.slice(-3) + out; s = s.slice(0, -3); }
      return (x < 0 && Math.round(x) !== 0 ? '-' : '') + s + out;
    }
    function bytes(x) {
      var a = Math.abs(x), units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], u = 0;
      while (a >= 1024 && u < units.length - 1) { a /= 1024; u++; }
      var sign = x < 0 ? '-' : '';
      return sign + (u === 0 ? String(Math.round(a)) : a.toFixed(a < 10 ? 2 : 1)) + ' ' + units[u];
    }
    function fmt(t, x) {
      return data.units[t] === 'bytes' ? bytes(x) + ' (' + groups(x) + ' B)' : groups(x);
    }
    function short(t, x) {
      return data.units[t] === 'bytes' ? bytes(x) : groups(x);
    }
    function pct(part, whole) {
      if (!whole) return '';
      return (100 * part / whole).toFixed(2) + '%';
    }
    function signed(t, x) { return (x > 0 ? '+' : '') + short(t, x); }

    // ---------------------------------------------------------------- state

    var normal = loadTree(data.tree);
    var inverted = null;
    var state = {tree: normal, type: Math.max(data.types.indexOf(data.sample), 0), zoom: 0,
                 search: null, matched: null, hover: -1};

    var canvas = byId('flame');
    var ctx = canvas.getContext('2d');
    var chart = byId('chart');
    var tooltip = byId('tooltip');
    var rows = [];  // rows[d] = flat [x0, x1, node, ...] in CSS pixels, for hit testing
    var charW = 7;
    var orient = byId('orient');  // optional: the static page draws icicles only
    var height = 0;  // of the canvas, in CSS pixels

    // The top of the row of depth d: from the top (icicle) or from the bottom (flame).
    function rowY(d) {
      return orient && orient.value === 'flame' ? height - (d + 1) * ROW - 1 : d * ROW;
    }
    function rowAt(y) {
      if (orient && orient.value === 'flame') return Math.ceil((height - 1 - y) / ROW) - 1;
      return Math.floor(y / ROW);
    }

    function text(id, s) { byId(id).textContent = s; }

    function setup() {
      text('title', data.title + (DIFF ? '  (diff: new \u2212 base)' : ''));
      var sel = byId('type');
      sel.textContent = '';
      for (var t = 0; t < NT; t++) {
        var o = document.createElement('option');
        o.value = String(t);
        o.textContent = data.types[t].replace('_', ' ');
        sel.appendChild(o);
      }
      sel.value = String(state.type);
      on(sel, 'change', function () { state.type = +sel.value; refresh(); });
      var search = byId('search');
      var timer = 0;
      on(search, 'input', function () {
        clearTimeout(timer);
        timer = setTimeout(function () { setSearch(search.value); }, 120);
      });
      on(search, 'keydown', function (e) {
        if (e.key === 'Enter') { clearTimeout(timer); setSearch(search.value); }
      });
      on(byId('invert'), 'change', function (e) {
        if (e.target.checked && !inverted) inverted = invertTree(normal);
        state.tree = e.target.checked ? inverted : normal;
        state.zoom = 0;
        setSearch(search.value);
      });
      if (orient) on(orient, 'change', function () { draw(); });
      on(byId('reset'), 'click', reset);
      on(document, 'keydown', function (e) {
        if (e.key === 'Escape') reset();
      });
      on(canvas, 'mousemove', onMove);
      on(canvas, 'mouseleave', function () { hideTip(); });
      on(canvas, 'click', onClick);
      on(window, 'resize', function () { draw(); });
    }

    function reset() {
      var search = byId('search');
      search.value = '';
      state.zoom = 0;
      setSearch('');
    }

    // A regular expression when the text is one, else a plain substring.
    function setSearch(q) {
      state.search = null;
      state.matched = null;
      if (q) {
        var re = null;
        try { re = new RegExp(q); } catch (e) { re = null; }
        var tr = state.tree, m = new Uint8Array(tr.n), memo = new Map();
        for (var k = 1; k < tr.n; k++) {
          var id = tr.name[k], hit = memo.get(id);
          if (hit === undefined) {
            var s = S[id];
            hit = re ? re.test(s) : s.indexOf(q) >= 0;
            memo.set(id, hit);
          }
          if (hit) m[k] = 1;
        }
        state.search = {text: q, regex: !!re};
        state.matched = m;
      }
      refresh();
    }

    // Sum of the matched frames that have no matched ancestor (recursion counts once).
    function matchedTotal() {
      var tr = state.tree, m = state.matched, t = state.type, sum = 0, count = 0;
      var stack = [0];
      while (stack.length) {
        var k = stack.pop();
        if (m[k]) { sum += value(tr, t, k); count++; continue; }
        for (var j = tr.start[k]; j < tr.start[k + 1]; j++) stack.push(tr.kids[j]);
      }
      return {sum: sum, frames: count};
    }

    function refresh() {
      if (state.tree.sortedFor !== state.type) computeWeights(state.tree, state.type);
      var tr = state.tree, t = state.type;
      var total = value(tr, t, 0);
      var label = DIFF ? 'Change: ' + signed(t, total) + '  (new ' + short(t, tr.total[t][0]) +
          ', base ' + short(t, tr.base[t][0]) + ')' : 'Total: ' + fmt(t, total);
      text('total', label + '  \u2022  ' + data.types[t].replace('_', ' '));
      if (state.matched) {
        var mt = matchedTotal();
        var whole = DIFF ? tr.base[t][0] : total;
        text('match', 'Matched' + (state.search.regex ? '' : ' (text)') + ': ' +
             (DIFF ? signed(t, mt.sum) : fmt(t, mt.sum)) +
             (whole ? ' = ' + pct(mt.sum, whole) + (DIFF ? ' of base' : ' of total') : '') +
             ' in ' + mt.frames + ' frame' + (mt.frames === 1 ? '' : 's'));
      } else {
        text('match', '');
      }
      crumbs();
      draw();
    }

    function crumbs() {
      var el = byId('crumbs');
      el.textContent = '';
      var tr = state.tree, chain = [];
      for (var k = state.zoom; k >= 0; k = tr.parent[k]) chain.push(k);
      chain.reverse();
      if (chain.length < 2) return;
      chain.forEach(function (k, i) {
        if (i) el.appendChild(document.createTextNode(' \u203a '));
        var a = document.createElement('button');
        a.type = 'button';
        a.className = 'crumb';
        a.textContent = S[tr.name[k]];
        a.addEventListener('click', function () { state.zoom = k; refresh(); });
        el.appendChild(a);
      });
    }

    // ---------------------------------------------------------------- drawing

    function hash(s) {
      var h = 2166136261;
      for (var i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 16777619); }
      return h >>> 0;
    }

    var maxDelta = 1;
    function color(tr, k, dim) {
      if (state.matched && state.matched[k]) return '#d63ad6';
      var name = S[tr.name[k]];
      var c;
      if (DIFF) {
        var d = value(tr, state.type, k), f = Math.min(Math.abs(d) / maxDelta, 1);
        var light = Math.round(95 - 45 * Math.sqrt(f));
        c = d > 0 ? 'hsl(0,80%,' + light + '%)' : d < 0 ? 'hsl(120,55%,' + light + '%)'
            : 'hsl(0,0%,88%)';
      } else if (k === 0) {
        c = 'hsl(30,15%,75%)';
      } else {
        var h = hash(name), mod = S[tr.module[k]], kind = KINDS[tr.kind[k]];
        // Whose code: the program's own in warm colours, the rest in cool, quiet ones.
        if (kind === 'library' || kind === 'wrapper') {
          c = 'hsl(' + (205 + h % 20) + ',12%,' + (74 + h % 10) + '%)';
        } else if (kind === 'dependency') {
          c = 'hsl(' + (190 + h % 25) + ',45%,' + (68 + h % 10) + '%)';
        } else if (mod === '[jit]') c = 'hsl(' + (150 + h % 40) + ',50%,60%)';
        else if (mod === '[unknown]' || !tr.file[k] && name.indexOf('+0x') > 0) {
          c = 'hsl(0,0%,' + (70 + h % 12) + '%)';
        } else if (tr.inl[k]) c = 'hsl(' + (40 + h % 20) + ',85%,' + (68 + h % 10) + '%)';
        else c = 'hsl(' + (h % 45) + ',' + (70 + (h >>> 8) % 25) + '%,' + (55 + (h >>> 16) % 12) + '%)';
      }
      return c;
    }

    function draw() {
      var tr = state.tree;
      if (tr.sortedFor !== state.type) computeWeights(tr, state.type);
      var dpr = window.devicePixelRatio || 1;
      var cs = window.getComputedStyle(chart);
      var W = Math.max(chart.clientWidth - parseFloat(cs.paddingLeft) -
                       parseFloat(cs.paddingRight), 200);
      var H = Math.min((tr.maxDepth + 1) * ROW + 2, Math.floor(32000 / dpr));
      height = H;
      canvas.style.width = W + 'px';
      canvas.style.height = H + 'px';
      canvas.width = Math.round(W * dpr);
      canvas.height = Math.round(H * dpr);
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, W, H);
      ctx.font = FONT;
      ctx.textBaseline = 'middle';
      charW = ctx.measureText('MMMMMMMMMM').width / 10 || 7;
      rows = [];
      for (var d = 0; d <= tr.maxDepth; d++) rows.push([]);
      var t = state.type;
      if (DIFF) {
        maxDelta = 1;
        for (var q = 1; q < tr.n; q++) {
          var dv = Math.abs(value(tr, t, q));
          if (dv > maxDelta) maxDelta = dv;
        }
      }
      // Ancestors of the zoomed frame span the full width (faded).
      var chain = [];
      for (var a = tr.parent[state.zoom]; a >= 0; a = tr.parent[a]) chain.push(a);
      for (var i = 0; i < chain.length; i++) box(tr, chain[i], 0, W, true);
      var w0 = tr.weight[state.zoom];
      if (w0 <= 0) { box(tr, state.zoom, 0, W, false); return; }
      var scale = W / w0;
      // Iterative walk: (node, x) pairs.
      var stack = [state.zoom, 0];
      while (stack.length) {
        var x = stack.pop(), k = stack.pop();
        var w = tr.weight[k] * scale;
        if (w < 0.4) continue;
        box(tr, k, x, w, false);
        var cx = x;
        for (var j = tr.start[k]; j < tr.start[k + 1]; j++) {
          var c = tr.kids[j], cw = tr.weight[c] * scale;
          if (cw < 0.4) break;  // children are sorted widest first
          stack.push(c, cx);
          cx += cw;
        }
      }
    }

    function box(tr, k, x, w, faded) {
      var d = tr.depth[k], y = rowY(d);
      if (d >= rows.length) return;
      ctx.globalAlpha = faded ? 0.55 : 1;
      ctx.fillStyle = color(tr, k, faded);
      ctx.fillRect(x, y, Math.max(w - (w > 2 ? 1 : 0), 0.5), ROW - 1);
      if (k === state.hover) {
        ctx.strokeStyle = '#000';
        ctx.lineWidth = 1;
        ctx.strokeRect(x + 0.5, y + 0.5, Math.max(w - 2, 0.5), ROW - 2);
      }
      if (w > charW * 3) {
        var name = S[tr.name[k]];
        var fit = Math.floor((w - 6) / charW);
        if (name.length > fit) name = name.slice(0, Math.max(fit - 1, 1)) + '\u2026';
        ctx.fillStyle = '#111';
        ctx.fillText(name, x + 3, y + ROW / 2);
      }
      ctx.globalAlpha = 1;
      rows[d].push(x, x + w, k);
    }

    // ---------------------------------------------------------------- interaction

    function hit(e) {
      var r = canvas.getBoundingClientRect();
      var x = e.clientX - r.left, y = e.clientY - r.top;
      var d = rowAt(y);
      if (d < 0 || d >= rows.length) return -1;
      var row = rows[d];
      for (var i = 0; i < row.length; i += 3) {
        if (x >= row[i] && x < row[i + 1]) return row[i + 2];
      }
      return -1;
    }

    function onMove(e) {
      var k = hit(e);
      if (k !== state.hover) {
        state.hover = k;
        draw();
      }
      if (k < 0) { hideTip(); return; }
      showTip(k, e.clientX, e.clientY);
    }

    function onClick(e) {
      var k = hit(e);
      if (k < 0) return;
      state.zoom = k;
      refresh();
    }

    function line(parent, label, value) {
      var div = document.createElement('div');
      if (label) {
        var b = document.createElement('span');
        b.className = 'k';
        b.textContent = label;
        div.appendChild(b);
      }
      div.appendChild(document.createTextNode(value));
      parent.appendChild(div);
    }

    function details(el, k) {
      var tr = state.tree, t = state.type;
      var bytesT = data.units[t] === 'bytes' ? t : t + 1;  // the pair of the same family
      var objsT = bytesT - 1;
      el.textContent = '';
      var head = document.createElement('div');
      head.className = 'fn';
      head.textContent = S[tr.name[k]];
      el.appendChild(head);
      var rootB = DIFF ? tr.base[bytesT][0] : tr.total[bytesT][0];
      var rootO = DIFF ? tr.base[objsT][0] : tr.total[objsT][0];
      if (DIFF) {
        line(el, 'bytes: ', signed(bytesT, value(tr, bytesT, k)) + '  (' +
             short(bytesT, tr.base[bytesT][k]) + ' \u2192 ' + short(bytesT, tr.total[bytesT][k]) +
             (rootB ? ', ' + pct(value(tr, bytesT, k), rootB) + ' of base' : '') + ')');
        line(el, 'objects: ', signed(objsT, value(tr, objsT, k)) + '  (' +
             groups(tr.base[objsT][k]) + ' \u2192 ' + groups(tr.total[objsT][k]) + ')');
      } else {
        line(el, 'bytes: ', fmt(bytesT, tr.total[bytesT][k]) +
             (rootB ? '  ' + pct(tr.total[bytesT][k], rootB) + ' of total' : ''));
        line(el, 'objects: ', groups(tr.total[objsT][k]) +
             (rootO ? '  ' + pct(tr.total[objsT][k], rootO) + ' of total' : ''));
      }
      if (k > 0) {
        var f = S[tr.file[k]];
        if (f) line(el, 'file: ', f + (tr.line[k] ? ':' + tr.line[k] : ''));
        var m = S[tr.module[k]];
        if (m) line(el, 'module: ', m + (tr.inl[k] ? '  (inlined)' : ''));
        else if (tr.inl[k]) line(el, '', '(inlined)');
        var kd = KINDS[tr.kind[k]];
        if (kd) line(el, 'code: ', KIND_TEXT[kd]);
      }
      line(el, 'type: ', data.types[t].replace('_', ' '));
    }

    function showTip(k, cx, cy) {
      details(tooltip, k);
      details(byId('details'), k);
      tooltip.hidden = false;
      var tw = tooltip.offsetWidth, th = tooltip.offsetHeight;
      var x = cx + 14, y = cy + 14;
      if (x + tw > window.innerWidth - 4) x = Math.max(cx - tw - 14, 4);
      if (y + th > window.innerHeight - 4) y = Math.max(cy - th - 14, 4);
      tooltip.style.left = x + 'px';
      tooltip.style.top = y + 'px';
    }

    function hideTip() {
      tooltip.hidden = true;
      if (state.hover >= 0) { state.hover = -1; draw(); }
    }

    var invert = byId('invert'), searchBox = byId('search');
    invert.checked = false;
    searchBox.value = '';
    setup();
    refresh();

    return Object.freeze({
      zoomName: function () { return S[state.tree.name[state.zoom]]; },
      nodeCount: function () { return state.tree.n; },
      frames: function (minWidth) {
        var out = [];  // x, y in CSS pixels from the canvas's top left corner
        for (var d = 0; d < rows.length; d++) {
          var row = rows[d];
          for (var i = 0; i < row.length; i += 3) {
            if (row[i + 1] - row[i] >= (minWidth || 0)) {
              out.push({name: S[state.tree.name[row[i + 2]]], x: row[i],
                        y: rowY(d), w: row[i + 1] - row[i], h: ROW, depth: d,
                        kind: KINDS[state.tree.kind[row[i + 2]]] || ''});
            }
          }
        }
        return out;
      },
      // Draw again at the container's current width (it was hidden when mounted).
      redraw: function () { draw(); },
      destroy: function () {
        listeners.forEach(function (l) { l[0].removeEventListener(l[1], l[2]); });
        listeners = [];
        tooltip.hidden = true;
        byId('crumbs').textContent = '';
      }
    });
  }

  window.heapscopeFlame = Object.freeze({mount: mount});

  var embedded = document.getElementById('heapscope-data');
  if (embedded) {
    var handle = mount(JSON.parse(embedded.textContent), {});
    // A read-only view of the state, for tests and the curious (no setters).
    window.heapscopeFlamegraph = Object.freeze({
      zoomName: handle.zoomName, nodeCount: handle.nodeCount, frames: handle.frames
    });
  }
})();
