// heapscope serve: the viewer's page. It reads the server's JSON endpoints and draws the
// session overview (processes, leaks, timeline, dumps), one dump, a merged set of dumps or
// a diff (top table, flame graph, call graph, callers/callees, source). Everything it shows
// from a dump (names, files, command lines) goes through textContent or SVG text nodes:
// never parsed as markup. The call graph, an SVG drawn by Graphviz, is shown as an image
// (it runs nothing and is no part of this document); clicks land on boxes laid over it.
// The state of a view lives in the address's #fragment, so a view can be reloaded or shared.
(function () {
  'use strict';

  var SAMPLES = ['inuse_space', 'inuse_objects', 'alloc_space', 'alloc_objects'];
  // The header's patterns: which stacks (focus, ignore), which frames (hide, show), whose
  // code and which wrappers (own, alloc_fn); each applies to every view.
  var PATTERNS = ['focus', 'ignore', 'hide', 'show', 'own', 'alloc_fn'];
  var TABS = ['top', 'flame', 'graph', 'peek', 'source'];
  var POLL_MS = 1500;
  var busy = 0;
  var inputsDoc = null;
  var version = -1;
  var flame = null;  // the mounted flame graph's handle
  var flameKey = '';
  var picked = [];  // dumps ticked for a diff or a merged set
  var shown = '';   // the fragment last drawn

  // ------------------------------------------------------------------ helpers

  function $(id) { return document.getElementById(id); }

  // An element with attributes (set as attributes, never as markup) and children
  // (strings become text nodes).
  function h(tag, attrs, kids) {
    var el = document.createElement(tag);
    if (attrs) {
      Object.keys(attrs).forEach(function (k) {
        if (attrs[k] !== null && attrs[k] !== undefined) el.setAttribute(k, String(attrs[k]));
      });
    }
    (kids || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      el.appendChild(typeof c === 'string' || typeof c === 'number' ?
                     document.createTextNode(String(c)) : c);
    });
    return el;
  }
  var SVG = 'http://www.w3.org/2000/svg';
  function s(tag, attrs, kids) {
    var el = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { el.setAttribute(k, String(attrs[k])); });
    (kids || []).forEach(function (c) {
      el.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return el;
  }

  function groups(x) {
    var v = String(Math.round(Math.abs(x))), out = '';
    while (v.length > 3) { out = ',' + v.slice(-3) + out; v = v.slice(0, -3); }
    return (x < 0 && Math.round(x) !== 0 ? '-' : '') + v + out;
  }
  function bytes(x) {
    var a = Math.abs(x), units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'], u = 0;
    while (a >= 1024 && u < units.length - 1) { a /= 1024; u++; }
    return (x < 0 ? '-' : '') + (u === 0 ? String(Math.round(a)) :
                                  a.toFixed(a < 10 ? 2 : 1)) + ' ' + units[u];
  }
  function amount(unit, x) { return unit === 'bytes' ? bytes(x) : groups(x); }
  // A change (a diff's values): always with its sign.
  function change(unit, x) { return (x > 0 ? '+' : '') + amount(unit, x); }
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(2) + '%' : ''; }

  function params() { return new URLSearchParams(location.hash.replace(/^#/, '')); }
  function link(p) { return '#' + new URLSearchParams(p).toString(); }
  // Go to a view: the fragment changes, and hashchange draws it.
  function go(p) { location.hash = new URLSearchParams(p).toString(); }
  function update(changes) {
    var p = params();
    Object.keys(changes).forEach(function (k) {
      if (changes[k] === null || changes[k] === '' || changes[k] === undefined) p.delete(k);
      else p.set(k, changes[k]);
    });
    go(p);
  }
  function filterParams(p) {
    var out = {};
    ['sample'].concat(PATTERNS).forEach(function (k) { if (p.get(k)) out[k] = p.get(k); });
    return out;
  }
  // What the leak report depends on among them: the fold.
  function frameParams(p) {
    var out = {};
    ['own', 'alloc_fn'].forEach(function (k) { if (p.get(k)) out[k] = p.get(k); });
    return out;
  }

  function showError(text) {
    var el = $('error');
    el.textContent = text || '';
    el.hidden = !text;
  }

  function api(path, query) {
    var q = new URLSearchParams(query || {});
    var url = path + (q.toString() ? '?' + q.toString() : '');
    busy++;
    return fetch(url, {credentials: 'same-origin', headers: {Accept: 'application/json'}})
      .then(function (r) {
        return r.json().then(function (doc) {
          if (!r.ok) throw new Error(doc.error || ('HTTP ' + r.status));
          return doc;
        });
      })
      .finally(function () { busy--; });
  }

  // ------------------------------------------------------------------ routing

  function render() {
    var p = params();
    shown = location.hash;
    showError('');
    var view = p.get('view') || 'overview';
    $('sample').value = p.get('sample') || 'inuse_space';
    PATTERNS.forEach(function (k) { $(k).value = p.get(k) || ''; });
    $('overview').hidden = view !== 'overview';
    $('dump').hidden = view === 'overview';
    if (view === 'overview') {
      $('where').textContent = '';
      drawOverview(p).catch(fail);
    } else {
      drawDump(p).catch(fail);
    }
  }
  function fail(e) { showError(String(e && e.message || e)); }

  function loadInputs() {
    return api('/api/inputs').then(function (doc) {
      inputsDoc = doc;
      version = doc.version;
      // The command line's --own and --alloc-fn, shown until the page sets its own.
      ['own', 'alloc_fn'].forEach(function (k) {
        var given = (doc.frames && doc.frames[k]) || [];
        if (given.length) $(k).placeholder = given.join(' | ');
      });
      return doc;
    });
  }
  function dumpById(id) {
    var found = null;
    (inputsDoc ? inputsDoc.inputs : []).forEach(function (inp) {
      inp.dumps.forEach(function (d) { if (d.id === +id) found = d; });
    });
    return found;
  }
  function dumpLabel(d) {
    if (!d) return '?';
    return d.name + (d.pid !== null ? '  (pid ' + d.pid + ')' : '');
  }

  // ------------------------------------------------------------------ overview

  function drawOverview(p) {
    return loadInputs().then(function (doc) {
      var root = $('inputs');
      var only = p.get('input');
      var parts = doc.inputs.filter(function (inp) {
        return only === null || String(inp.id) === only;
      });
      return Promise.all(parts.map(function (inp) {
        return Promise.all([api('/api/session/' + inp.id + '/leaks', frameParams(p)),
                            api('/api/session/' + inp.id + '/timeline', frameParams(p))])
          .then(function (got) { return {inp: inp, leaks: got[0], timeline: got[1]}; });
      })).then(function (all) {
        root.textContent = '';
        all.forEach(function (x) { root.appendChild(inputSection(x, p)); });
        syncPicks();
      });
    });
  }

  function inputSection(x, p) {
    var inp = x.inp, leaks = x.leaks, pid = p.get('pid');
    var sec = h('section', {'class': 'input', id: 'input-' + inp.id, 'data-input': inp.id});
    sec.appendChild(h('h2', null, [inp.title + '  ', h('span', {'class': 'muted'},
                                                          ['(' + inp.kind + ')'])]));
    sec.appendChild(h('div', {'class': 'path'}, [inp.path]));
    if (inp.problem && !inp.dumps.length) sec.appendChild(h('p', {'class': 'note'},
                                                            [inp.problem]));
    sec.appendChild(processTable(inp, leaks, pid));
    sec.appendChild(timelineChart(x.timeline, pid));
    sec.appendChild(dumpsList(inp, pid));
    sec.appendChild(leaksTable(inp, leaks, pid));
    (leaks.notes || []).forEach(function (n) { sec.appendChild(h('p', {'class': 'note'},
                                                                 ['note: ' + n])); });
    return sec;
  }

  function processTable(inp, leaks, pid) {
    var box = h('div', null, [h('h3', null, ['Processes ', h('span', {'class': 'muted'},
      [pid ? '(showing pid ' + pid + ': click it again for all)' :
             '(click one to show only it)'])])]);
    var body = h('tbody');
    leaks.processes.forEach(function (proc) {
      var title = leaks.titles[String(proc.pid)] ||
          (proc.cmdline && proc.cmdline.length ? proc.cmdline.join(' ') : proc.exe);
      var dumps = proc.judged_dumps && proc.judged_dumps !== proc.dumps ?
          proc.dumps + ' (' + proc.judged_dumps + ' judged)' : String(proc.dumps);
      var tr = h('tr', {'class': 'proc-row' + (String(proc.pid) === pid ? ' chosen' : ''),
                        'data-pid': proc.pid}, [
        h('td', {'class': 'name'}, [title || '?']),
        h('td', {'class': 'num'}, [String(proc.pid)]),
        h('td', null, [proc.role]),
        h('td', {'class': 'verdict-' + proc.verdict.split(' ')[0]}, [proc.verdict]),
        h('td', {'class': 'num'}, [dumps]),
        h('td', {'class': 'num'}, [bytes(proc.live_bytes)]),
        h('td', {'class': 'num'}, [proc.leak_bytes ? bytes(proc.leak_bytes) : '']),
        h('td', {'class': 'num'}, [proc.growing_bytes ? bytes(proc.growing_bytes) : ''])]);
      tr.addEventListener('click', function () {
        update({pid: String(proc.pid) === pid ? null : String(proc.pid)});
      });
      body.appendChild(tr);
    });
    box.appendChild(h('table', {'class': 'grid processes'}, [
      h('thead', null, [h('tr', null, ['process', 'pid', 'role', 'verdict', 'dumps', 'live',
                                       'leak', 'growing'].map(function (c, i) {
        return h('th', {'class': i === 1 || i > 3 ? 'num' : null}, [c]);
      }))]), body]));
    return box;
  }

  function leaksTable(inp, leaks, pid) {
    var box = h('div', null, [h('h3', null, ['Leak report'])]);
    var body = h('tbody');
    var rows = 0;
    leaks.suspects.forEach(function (f, k) {
      if (pid && String(f.pid) !== pid) return;
      if (f.verdict === 'steady' || f.verdict === 'expected' || f.verdict === 'inherited' ||
          f.verdict === 'suppressed') return;
      rows++;
      var dumps = leaks.dumps[String(f.pid)] || [];
      var last = dumps.length ? dumps[dumps.length - 1] : null;
      var where = f.file ? f.file + ':' + f.line : f.module;
      var acts = h('span', {'class': 'actions'});
      if (last !== null) {
        var fold = frameParams(params());
        acts.appendChild(h('a', {'class': 'flame-link', href: link(Object.assign({
          view: 'dump', id: last, tab: 'flame', search: f.function}, fold))}, ['flame graph']));
        acts.appendChild(h('a', {'class': 'peek-link', href: link(Object.assign({
          view: 'dump', id: last, tab: 'peek', fn: f.function}, fold))}, ['callers']));
        if (f.file) {
          acts.appendChild(h('a', {'class': 'src-link', href: link(Object.assign({
            view: 'dump', id: last, tab: 'source', file: f.file, line: f.line}, fold))},
            ['source']));
        }
      }
      body.appendChild(h('tr', {'class': 'suspect', 'data-pid': f.pid}, [
        h('td', {'class': 'verdict-' + f.verdict}, [f.verdict]),
        h('td', {'class': 'name'}, [f.function, h('div', {'class': 'evidence'},
                                                   [leaks.evidence[k] || ''])]),
        h('td', {'class': 'name'}, [where || '', h('div', null, [acts])]),
        h('td', {'class': 'num'}, [String(f.pid)]),
        h('td', {'class': 'num'}, [bytes(f.bytes)]),
        h('td', {'class': 'num'}, [f.growth_bytes !== undefined && f.growth_bytes !== null ?
                                   bytes(f.growth_bytes) : ''])]));
    });
    if (!rows) {
      box.appendChild(h('p', {'class': 'note'}, ['No site grew or is live beyond start-up ' +
                                                 'memory' + (pid ? ' in this process.' : '.')]));
      return box;
    }
    box.appendChild(h('table', {'class': 'grid leaks'}, [
      h('thead', null, [h('tr', null, ['verdict', 'site and evidence', 'where', 'pid',
                                       'live', 'growth'].map(function (c, i) {
        return h('th', {'class': i > 2 ? 'num' : null}, [c]);
      }))]), body]));
    return box;
  }

  var COLORS = ['#1f4e9c', '#2ca02c', '#0d7d8a', '#7b4fb3', '#8c6d31', '#4a7fd0'];
  var SUSPECT_COLORS = ['#d62728', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#bcbd22'];

  function timelineChart(tl, pid) {
    var box = h('div', {'class': 'chart'}, [h('h3', null, ['Timeline'])]);
    var lines = tl.lines.filter(function (l) { return !pid || String(l.pid) === pid; });
    if (!lines.length) {
      (tl.notes.length ? tl.notes : ['nothing to draw']).slice(0, 1).forEach(function (n) {
        box.appendChild(h('p', {'class': 'note'}, [n]));
      });
      return box;
    }
    box.appendChild(h('p', {id: 'timeline-help'}, [
      'Solid: RSS; dashed: the heap the dumps account for; dotted lines: the top suspects. ' +
      'Click a dump (a dot) to open it; shift-click dumps to tick them for a diff or a ' +
      'merged set (below).']));
    var W = Math.max(Math.min(($('inputs').clientWidth || 1000) - 20, 1400), 600), H = 300;
    var L = 80, R = 20, T = 14, B = 34;
    var xmax = 0, ymax = 0;
    lines.forEach(function (l) {
      l.points.forEach(function (pt) { xmax = Math.max(xmax, pt[0]); ymax = Math.max(ymax, pt[1]); });
    });
    xmax = (xmax || 1) * 1.02;
    ymax = (ymax || 1) * 1.08;
    function sx(x) { return L + (W - L - R) * x / xmax; }
    function sy(y) { return T + (H - T - B) * (1 - y / ymax); }
    var svg = s('svg', {width: W, height: H, viewBox: '0 0 ' + W + ' ' + H, role: 'img',
                        'font-size': 11, 'font-family': 'sans-serif'});
    for (var k = 0; k <= 4; k++) {
      var yv = ymax * k / 4, y = sy(yv);
      svg.appendChild(s('line', {x1: L, x2: W - R, y1: y, y2: y, stroke: '#eee'}));
      svg.appendChild(s('text', {x: L - 6, y: y + 4, 'text-anchor': 'end', fill: '#555'},
                        [bytes(yv)]));
      var xv = xmax * k / 4, x = sx(xv);
      svg.appendChild(s('text', {x: x, y: H - B + 16, 'text-anchor': 'middle', fill: '#555'},
                        [xv.toFixed(xv < 10 ? 1 : 0) + ' s']));
    }
    svg.appendChild(s('rect', {x: L, y: T, width: W - L - R, height: H - T - B, fill: 'none',
                               stroke: '#999'}));
    var legend = h('ul', {'class': 'legend'});
    var order = {}, nproc = 0, nsus = 0;
    lines.forEach(function (l) {
      var color, dash = '';
      if (l.kind === 'suspect') {
        color = SUSPECT_COLORS[nsus++ % SUSPECT_COLORS.length];
        dash = '2 3';
      } else {
        if (!(l.pid in order)) order[l.pid] = nproc++;
        color = COLORS[order[l.pid] % COLORS.length];
        if (l.kind === 'heap') dash = '7 4';
      }
      var pts = l.points.map(function (pt) { return sx(pt[0]).toFixed(1) + ',' +
                                                    sy(pt[1]).toFixed(1); }).join(' ');
      var g = s('g', {'class': 'series ' + l.kind}, [s('title', {}, [l.label])]);
      var attrs = {points: pts, fill: 'none', stroke: color, 'stroke-width': 2};
      if (dash) attrs['stroke-dasharray'] = dash;
      if (l.points.length > 1) g.appendChild(s('polyline', attrs));
      if (l.kind !== 'rss') {
        l.points.forEach(function (pt) {
          var c = s('circle', {cx: sx(pt[0]).toFixed(1), cy: sy(pt[1]).toFixed(1),
                               r: l.kind === 'heap' ? 5 : 3.5, fill: color,
                               'class': pt[2] !== null ? 'pt' : 'dot'},
                    [s('title', {}, [l.label + '\n' + pt[0].toFixed(2) + ' s: ' +
                                    bytes(pt[1])])]);
          if (pt[2] !== null) {
            c.setAttribute('data-dump', pt[2]);
            c.addEventListener('click', function (e) {
              if (e.shiftKey || e.ctrlKey || e.metaKey) pick(pt[2]);
              else go(Object.assign({view: 'dump', id: pt[2]}, filterParams(params())));
            });
          }
          g.appendChild(c);
        });
      }
      svg.appendChild(g);
      var sw = h('span', {'class': 'swatch'});
      sw.style.background = color;
      legend.appendChild(h('li', null, [sw, l.label + (l.detail ? ' (' + l.detail + ')' : '')]));
    });
    box.appendChild(svg);
    box.appendChild(legend);
    return box;
  }

  function dumpsList(inp, pid) {
    var box = h('div', null, [h('h3', null, ['Dumps ', h('span', {'class': 'muted'},
      ['(open one; tick two for their diff, or several to add them up)'])])]);
    var diffBtn = h('button', {type: 'button', 'class': 'diff-picked'}, ['Diff']);
    var mergeBtn = h('button', {type: 'button', 'class': 'merge-picked'}, ['Open merged']);
    diffBtn.addEventListener('click', openDiff);
    mergeBtn.addEventListener('click', openMerged);
    box.appendChild(h('div', {'class': 'pick-bar'}, [diffBtn, mergeBtn,
      h('span', {'class': 'pick-count muted'})]));
    var body = h('tbody');
    inp.dumps.forEach(function (d) {
      if (pid && String(d.pid) !== pid) return;
      var box2 = h('input', {type: 'checkbox', 'class': 'pick', 'data-dump': d.id,
                             'aria-label': 'tick for a diff or a merged set'});
      box2.addEventListener('change', function () { pick(d.id); });
      var when = d.time ? new Date(d.time * 1000).toLocaleTimeString() : '';
      body.appendChild(h('tr', {'class': 'dump-row', 'data-dump': d.id}, [
        h('td', null, [box2]),
        h('td', {'class': 'name'}, [h('a', {'class': 'open-dump', 'data-dump': d.id,
          href: link(Object.assign({view: 'dump', id: d.id}, filterParams(params())))},
          [d.name])]),
        h('td', {'class': 'num'}, [d.pid === null ? '' : String(d.pid)]),
        h('td', null, [d.kind]), h('td', null, [when]),
        h('td', {'class': 'num'}, [bytes(d.size)])]));
    });
    box.appendChild(h('div', {'class': 'dumps-list'}, [h('table', {'class': 'grid dumps'}, [
      h('thead', null, [h('tr', null, ['', 'dump', 'pid', 'kind', 'written', 'size'].map(
        function (c, i) { return h('th', {'class': i === 2 || i === 5 ? 'num' : null}, [c]); }))]),
      body])]));
    return box;
  }

  // Tick (or untick) a dump for a diff or a merged set.
  function pick(id) {
    var at = picked.indexOf(id);
    if (at >= 0) picked.splice(at, 1);
    else picked.push(id);
    syncPicks();
  }
  // Two ticked dumps: their diff, the older one as the base.
  function openDiff() {
    if (picked.length !== 2) return;
    var a = Math.min(picked[0], picked[1]), b = Math.max(picked[0], picked[1]);
    picked = [];
    go(Object.assign({view: 'diff', a: a, b: b}, filterParams(params())));
  }
  // Two or more: added up into one report, as top --merge.
  function openMerged() {
    if (picked.length < 2) return;
    var ids = picked.slice().sort(function (x, y) { return x - y; }).join(',');
    picked = [];
    go(Object.assign({view: 'merged', ids: ids}, filterParams(params())));
  }
  function syncPicks() {
    document.querySelectorAll('input.pick').forEach(function (el) {
      el.checked = picked.indexOf(+el.getAttribute('data-dump')) >= 0;
    });
    document.querySelectorAll('button.diff-picked').forEach(function (el) {
      el.disabled = picked.length !== 2;
    });
    document.querySelectorAll('button.merge-picked').forEach(function (el) {
      el.disabled = picked.length < 2;
      el.textContent = 'Open merged' + (picked.length >= 2 ? ' (' + picked.length + ')' : '');
    });
    document.querySelectorAll('.pick-count').forEach(function (el) {
      el.textContent = picked.length ? picked.length + ' ticked' : '';
    });
    document.querySelectorAll('circle.pt').forEach(function (el) {
      el.classList.toggle('picked', picked.indexOf(+el.getAttribute('data-dump')) >= 0);
    });
  }

  // ------------------------------------------------------------------ one dump, or a diff

  // What a view shows: dump ids (several for a merged set) and a base for a diff.
  function target(p) {
    var view = p.get('view');
    if (view === 'diff') return {ids: [p.get('b')], base: p.get('a'), merged: false};
    if (view === 'merged') {
      return {ids: (p.get('ids') || '').split(','), base: p.get('base'), merged: true};
    }
    return {ids: [p.get('id')], base: null, merged: false};
  }
  function endpoint(t, what) {
    return t.merged ? '/api/merged/' + what : '/api/dump/' + t.ids[0] + '/' + what;
  }
  function query(p, extra) {
    var q = filterParams(p), t = target(p);
    if (t.base !== null) q.base = t.base;
    if (t.merged) q.ids = t.ids.join(',');
    return Object.assign(q, extra || {});
  }
  function targetTitle(t) {
    var title = t.ids.map(function (id) { return dumpLabel(dumpById(id)); });
    if (t.merged) {
      title = ['merged: ' + t.ids.length + ' dumps: ' + title.slice(0, 4).join(', ') +
               (title.length > 4 ? ', \u2026' : '')];
    }
    if (t.base !== null) title.push(' minus  ' + dumpLabel(dumpById(t.base)) +
                                    '  (new \u2212 base)');
    return title.join(' ');
  }

  function drawDump(p) {
    var t = target(p);
    var tab = p.get('tab') || 'top';
    var ready = inputsDoc ? Promise.resolve(inputsDoc) : loadInputs();
    return ready.then(function () {
      $('dump-title').textContent = targetTitle(t);
      $('where').textContent = ' \u203a ' + (t.merged ? 'merged' : t.base !== null ? 'diff' :
                                             'dump');
      document.querySelectorAll('#tabs button').forEach(function (btn) {
        btn.classList.toggle('active', btn.getAttribute('data-tab') === tab);
      });
      TABS.forEach(function (name) { $('pane-' + name).hidden = name !== tab; });
      if (tab === 'top') return drawTop(p);
      if (tab === 'flame') return drawFlame(p);
      if (tab === 'graph') return drawGraph(p);
      if (tab === 'peek') return drawPeek(p);
      return drawSource(p);
    });
  }

  function drawTop(p) {
    var t = target(p);
    var gran = p.get('granularity') || 'functions', cum = p.get('cum') === '1';
    var n = p.get('n') || '100';
    $('granularity').value = gran;
    $('cum').checked = cum;
    $('rows').value = n;
    return api(endpoint(t, 'top'), query(p, {granularity: gran, cum: cum ? 1 : 0, n: n}))
      .then(function (doc) {
      var body = $('top-table').querySelector('tbody');
      body.textContent = '';
      var sum = 0, total = doc.total;
      var rows = doc.rows.slice();
      if (p.get('order') === 'name') {
        rows.sort(function (a, b) { return a.name < b.name ? -1 : a.name > b.name ? 1 : 0; });
      }
      document.querySelectorAll('#top-table th.sort').forEach(function (th) {
        var key = th.getAttribute('data-sort');
        th.classList.toggle('sorted', key === (p.get('order') === 'name' ? 'name' :
                                               cum ? 'cum' : 'flat'));
      });
      var show = doc.diff ? change : amount;
      rows.forEach(function (r) {
        sum += r.flat;
        var where = r.file ? r.file + (r.line ? ':' + r.line : '') : '';
        var name = h('a', {'class': 'row-peek', href: link(Object.assign(
          paramsObject(p), {tab: 'peek', fn: r.name}))}, [r.name]);
        var whereCell = r.file ? h('a', {'class': 'row-source', href: link(Object.assign(
          paramsObject(p), {tab: 'source', file: r.file, line: r.line || ''}))}, [where]) : '';
        var via = r.via && r.via.length ? h('div', {'class': 'evidence'},
          ['via ' + r.via.map(function (v) { return v.function; }).join(' \u2190 ')]) : null;
        body.appendChild(h('tr', {'class': 'top-row'}, [
          h('td', {'class': 'num'}, [show(doc.unit, r.flat)]),
          h('td', {'class': 'num'}, [pct(r.flat, total)]),
          h('td', {'class': 'num'}, [pct(sum, total)]),
          h('td', {'class': 'num'}, [show(doc.unit, r.cum)]),
          h('td', {'class': 'num'}, [pct(r.cum, total)]),
          h('td', {'class': 'name'}, [name, via]),
          h('td', {'class': 'name'}, [whereCell]),
          h('td', null, [r.module])]));
      });
      $('top-total').textContent = (doc.diff ? 'Change: ' : 'Total: ') +
          show(doc.unit, total) + ' ' + doc.sample_type.replace('_', ' ') +
          ' \u2022 ' + doc.rows.length + ' rows' + PATTERNS.map(function (k) {
            return p.get(k) ? ' \u2022 ' + k.replace('_', ' ') + ' ' + p.get(k) : '';
          }).join('');
      $('dump-notes').textContent = (doc.notes || []).join(' \u2022 ');
    });
  }

  function paramsObject(p) {
    var out = {};
    p.forEach(function (v, k) { out[k] = v; });
    return out;
  }

  function drawFlame(p) {
    var t = target(p);
    var key = JSON.stringify([t, filterParams(p)]);
    if (flame && key === flameKey) {
      drawnAs(p);
      return Promise.resolve();
    }
    return api(endpoint(t, 'flame'), query(p)).then(function (data) {
      if (flame) flame.destroy();
      flameKey = key;
      flame = window.heapscopeFlame.mount(data, {prefix: 'fg-'});
      var want = p.get('search');
      if (want) {
        var box = $('fg-search');
        box.value = want;
        box.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}));
      }
      drawnAs(p);
    });
  }

  // The flame graph drawn as the URL says: icicle or flame, callees or callers.
  function drawnAs(p) {
    var orient = p.get('draw') === 'flame' ? 'flame' : 'icicle';
    var invert = $('fg-invert'), inverted = p.get('invert') === '1';
    $('fg-orient').value = orient;
    if (invert.checked !== inverted) {
      invert.checked = inverted;
      invert.dispatchEvent(new Event('change'));  // the flame graph builds that tree
    }
    flame.redraw();
  }

  // The call graph: Graphviz's SVG as an image, and a box over each node to click.
  function drawGraph(p) {
    var t = target(p), nodes = p.get('nodecount') || '80', fit = p.get('fit') !== '0';
    $('graph-nodes').value = nodes;
    $('graph-fit').checked = fit;
    return api(endpoint(t, 'graph'), query(p, {granularity: p.get('granularity') || 'functions',
                                                nodecount: nodes})).then(function (doc) {
      var img = $('graph-img'), hits = $('graph-hits'), message = $('graph-message');
      hits.textContent = '';
      $('graph-status').textContent = 'Showing ' + doc.shown_nodes + ' of ' + doc.all_nodes +
          ' nodes, ' + doc.shown_edges + ' of ' + doc.all_edges + ' edges \u2022 ' +
          (doc.diff ? 'Change: ' + change(doc.unit, doc.total) : 'Total: ' +
           amount(doc.unit, doc.total)) + ' ' + doc.sample_type.replace('_', ' ');
      message.textContent = doc.message || '';
      message.hidden = !doc.message;
      img.hidden = !doc.svg;
      $('graph-frame').classList.toggle('list', !doc.svg);
      if (!doc.svg) {
        // No picture (no Graphviz here): the nodes as a list, each still a focus to set.
        img.removeAttribute('src');
        doc.nodes.forEach(function (n) {
          var el = h('div', {'class': 'graph-node graph-row', 'data-name': n.name,
                             role: 'button', tabindex: '0'},
                     [n.label + '  flat ' + (doc.diff ? change : amount)(doc.unit, n.flat) +
                      ', cum ' + (doc.diff ? change : amount)(doc.unit, n.cum)]);
          el.addEventListener('click', function () { update({focus: n.focus}); });
          hits.appendChild(el);
        });
        return null;
      }
      // Graphviz measures in points (1/72 in), the page in CSS pixels (1/96 in); a graph
      // wider than the pane is shrunk to fit it unless asked not to.
      var natural = doc.width * 96 / 72, room = Math.max($('graph-box').clientWidth - 2, 200);
      img.style.width = (fit ? Math.min(natural, room) : natural) + 'px';
      var focus = p.get('focus');
      doc.nodes.forEach(function (n) {
        if (!n.box) return;
        var tip = n.label + (n.module ? ' [' + n.module + ']' : '') + '\nflat ' +
            (doc.diff ? change : amount)(doc.unit, n.flat) + '\ncum ' +
            (doc.diff ? change : amount)(doc.unit, n.cum) + '\nclick: focus on it';
        var el = h('div', {'class': 'graph-node' + (n.focus === focus ? ' focused' : ''),
                           'data-name': n.name, title: tip, role: 'button', tabindex: '0'});
        el.style.left = (100 * n.box[0]) + '%';
        el.style.top = (100 * n.box[1]) + '%';
        el.style.width = (100 * n.box[2]) + '%';
        el.style.height = (100 * n.box[3]) + '%';
        el.addEventListener('click', function () { update({focus: n.focus}); });
        el.addEventListener('keydown', function (e) {
          if (e.key === 'Enter') update({focus: n.focus});
        });
        hits.appendChild(el);
      });
      return shownImage(img, 'data:image/svg+xml;charset=utf-8,' +
                        encodeURIComponent(doc.svg));
    });
  }

  // Show the image at ``src``; resolves once it is drawn (the page counts as busy till then).
  function shownImage(img, src) {
    if (img.getAttribute('src') === src && img.complete) return Promise.resolve();
    busy++;
    return new Promise(function (resolve) {
      function done() {
        img.removeEventListener('load', done);
        img.removeEventListener('error', done);
        busy--;
        resolve();
      }
      img.addEventListener('load', done);
      img.addEventListener('error', done);
      img.setAttribute('src', src);
    });
  }

  function drawPeek(p) {
    var t = target(p), name = p.get('fn') || '';
    $('peek-name').value = name;
    var body = $('peek-body');
    if (!name) {
      body.textContent = '';
      body.appendChild(h('p', {'class': 'note'}, ['Click a name in the Top table, or type ' +
                                                  'a function name.']));
      return Promise.resolve();
    }
    return api(endpoint(t, 'peek'), query(p, {function: name}))
      .then(function (doc) {
        body.textContent = '';
        body.appendChild(h('h2', {'class': 'name', id: 'peek-function'}, [doc.function]));
        body.appendChild(h('p', null, ['flat ' + amount(doc.unit, doc.flat) + ' (' +
          pct(doc.flat, doc.total) + '), cum ' + amount(doc.unit, doc.cum) + ' (' +
          pct(doc.cum, doc.total) + ') of ' + amount(doc.unit, doc.total) + ' ' +
          doc.sample_type.replace('_', ' ')]));
        doc.files.forEach(function (f) {
          body.appendChild(h('div', null, [h('a', {'class': 'peek-source', href: link(
            Object.assign(paramsObject(p), {tab: 'source', file: f}))}, ['source: ' + f])]));
        });
        [['Callers', doc.callers, 'callers'], ['Callees', doc.callees, 'callees']]
          .forEach(function (part) {
            body.appendChild(h('h3', null, [part[0]]));
            if (!part[1].length) { body.appendChild(h('p', {'class': 'note'}, ['none'])); return; }
            var tb = h('tbody');
            part[1].forEach(function (c) {
              tb.appendChild(h('tr', null, [
                h('td', {'class': 'num'}, [amount(doc.unit, c.value)]),
                h('td', {'class': 'num'}, [pct(c.value, doc.cum)]),
                h('td', {'class': 'name'}, [h('a', {href: link(Object.assign(paramsObject(p),
                  {fn: c.name}))}, [c.name])])]));
            });
            body.appendChild(h('table', {'class': 'grid ' + part[2]}, [
              h('thead', null, [h('tr', null, [h('th', {'class': 'num'}, ['through the call']),
                                               h('th', {'class': 'num'}, ['of cum']),
                                               h('th', null, ['function'])])]), tb]));
          });
      });
  }

  function drawSource(p) {
    var t = target(p), file = p.get('file') || '', mark = +(p.get('line') || 0);
    var head = $('source-head'), body = $('source-body');
    head.textContent = '';
    body.textContent = '';
    if (!file) {
      body.appendChild(h('p', {'class': 'note'}, ['Open a source file from the Top table ' +
                                                  '(its "where" column) or a leak suspect.']));
      return Promise.resolve();
    }
    return api(endpoint(t, 'source'), query(p, {file: file})).then(function (doc) {
      var space = doc.sample_type, family = space.split('_')[0];
      head.appendChild(h('h2', {'class': 'name', id: 'source-file'}, [doc.path || doc.file]));
      head.appendChild(h('p', {'class': 'note'}, [
        'Per line: ' + family + ' bytes and objects allocated with the line as the site ' +
        '(as in top --lines), and bytes allocated through it (cum).']));
      if (!doc.found) {
        body.appendChild(h('p', {'class': 'message', id: 'source-missing'}, [doc.message]));
      }
      var lines = doc.lines || [];
      var nums = Object.keys(doc.values).map(Number);
      if (!doc.found) {
        lines = [];
        nums.forEach(function (k) { lines[k - 1] = ''; });
      }
      var tb = h('tbody');
      var marked = null;
      for (var i = 0; i < lines.length; i++) {
        var no = i + 1, v = doc.values[String(no)];
        if (!doc.found && !v) continue;
        var tr = h('tr', {'class': (v && (v.flat || v.cum) ? 'hot' : '') +
                                   (no === mark ? ' marked' : ''), 'data-line': no}, [
          h('td', {'class': 'lineno'}, [String(no)]),
          h('td', {'class': 'num flat'}, [v && v.flat ? bytes(v.flat) : '']),
          h('td', {'class': 'num objects'}, [v && v.flat_objects ? groups(v.flat_objects) : '']),
          h('td', {'class': 'num cum'}, [v && v.cum ? bytes(v.cum) : '']),
          h('td', {'class': 'text'}, [lines[i] || ''])]);
        if (no === mark) marked = tr;
        tb.appendChild(tr);
      }
      body.appendChild(h('table', {'class': 'grid', id: 'source-table'}, [
        h('thead', null, [h('tr', null, [h('th', null, ['line']), h('th', {'class': 'num'},
          ['bytes']), h('th', {'class': 'num'}, ['objects']), h('th', {'class': 'num'},
          ['cum']), h('th', null, ['source'])])]), tb]));
      if (doc.message && doc.found) body.appendChild(h('p', {'class': 'note'}, [doc.message]));
      if (marked) marked.scrollIntoView({block: 'center'});
    });
  }

  // ------------------------------------------------------------------ controls

  function setup() {
    function applyFilters() {
      var changes = {sample: $('sample').value === 'inuse_space' ? null : $('sample').value};
      PATTERNS.forEach(function (k) { changes[k] = $(k).value; });
      update(changes);
    }
    $('sample').addEventListener('change', applyFilters);
    $('apply').addEventListener('click', applyFilters);
    PATTERNS.forEach(function (id) {
      $(id).addEventListener('keydown', function (e) { if (e.key === 'Enter') applyFilters(); });
    });
    $('clear').addEventListener('click', function () {
      var changes = {};
      PATTERNS.forEach(function (k) { changes[k] = null; });
      update(changes);
    });
    $('fg-orient').addEventListener('change', function () {
      update({draw: $('fg-orient').value === 'flame' ? 'flame' : null});
    });
    $('fg-invert').addEventListener('change', function () {
      update({invert: $('fg-invert').checked ? '1' : null});
    });
    $('graph-nodes').addEventListener('change', function () {
      update({nodecount: $('graph-nodes').value === '80' ? null : $('graph-nodes').value});
    });
    $('graph-fit').addEventListener('change', function () {
      update({fit: $('graph-fit').checked ? null : '0'});
    });
    document.querySelectorAll('#tabs button').forEach(function (btn) {
      btn.addEventListener('click', function () { update({tab: btn.getAttribute('data-tab')}); });
    });
    $('granularity').addEventListener('change', function () {
      update({granularity: $('granularity').value === 'functions' ? null :
              $('granularity').value});
    });
    $('cum').addEventListener('change', function () {
      update({cum: $('cum').checked ? '1' : null, order: null});
    });
    $('rows').addEventListener('change', function () {
      update({n: $('rows').value === '100' ? null : $('rows').value});
    });
    document.querySelectorAll('#top-table th.sort').forEach(function (th) {
      th.addEventListener('click', function () {
        var key = th.getAttribute('data-sort');
        if (key === 'name') update({order: 'name'});
        else update({cum: key === 'cum' ? '1' : null, order: null});
      });
    });
    function peekNow() { update({tab: 'peek', fn: $('peek-name').value}); }
    $('peek-go').addEventListener('click', peekNow);
    $('peek-name').addEventListener('keydown', function (e) { if (e.key === 'Enter') peekNow(); });
    window.addEventListener('hashchange', function () {
      if (location.hash !== shown) render();
    });
  }

  // Live: a session still being written gains dumps; the overview follows without a reload.
  function poll() {
    api('/api/version').then(function (doc) {
      if (version >= 0 && doc.version !== version) {
        version = doc.version;
        $('live').textContent = 'updated ' + new Date().toLocaleTimeString();
        var p = params();
        if ((p.get('view') || 'overview') === 'overview') drawOverview(p).catch(fail);
        else loadInputs().catch(fail);
      }
    }).catch(function () { $('live').textContent = 'server not answering'; })
      .finally(function () { setTimeout(poll, POLL_MS); });
  }

  // For tests and the curious: read-only views of the page's state.
  window.heapscopeViewer = Object.freeze({
    idle: function () { return busy === 0; },
    flame: function () { return flame; },
    version: function () { return version; },
    samples: SAMPLES
  });

  setup();
  render();
  setTimeout(poll, POLL_MS);
})();
