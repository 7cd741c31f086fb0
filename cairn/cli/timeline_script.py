"""The timeline page's scripts: what runs in the browser, kept apart from the markup.

`EARLY_SCRIPT` runs first and notes any script error on the page; `DIFF_SCRIPT` is the
line diff; `SCRIPT` draws a step's or a diff's detail from the page's JSON data and wires
the clicks, the selects, the zoom and the `#step=` / `#diff=` links. Task strings reach the
document through `textContent` and `setAttribute` only, never as markup.
"""

EARLY_SCRIPT = """
window.cairnErrors = [];
window.onerror = function (message) {
  window.cairnErrors.push(String(message));
  var note = document.createElement('div');
  note.id = 'cairn-js-error';
  note.textContent = 'script error: ' + message;
  (document.body || document.documentElement).appendChild(note);
  return false;
};
"""

# The page's line diff: Myers' shortest edit script, grouped into hunks of three lines of
# context and written as Python's difflib writes a unified diff, which `cairn diff` prints.
DIFF_SCRIPT = """
function splitLines(text) { return text.match(/[^\\n]*\\n|[^\\n]+$/g) || []; }
function editScript(a, b) {
  var n = a.length, m = b.length, v = {1: 0}, trace = [], d, k, x, y;
  search: for (d = 0; d <= n + m; d++) {
    if (d > MAX_EDITS) return null;
    trace.push(Object.assign({}, v));
    for (k = -d; k <= d; k += 2) {
      x = (k === -d || (k !== d && v[k - 1] < v[k + 1])) ? v[k + 1] : v[k - 1] + 1;
      y = x - k;
      while (x < n && y < m && a[x] === b[y]) { x++; y++; }
      v[k] = x;
      if (x >= n && y >= m) break search;
    }
  }
  var ops = [];
  x = n; y = m;
  for (d = trace.length - 1; d >= 0; d--) {
    var seen = trace[d];
    k = x - y;
    var back = (k === -d || (k !== d && seen[k - 1] < seen[k + 1])) ? k + 1 : k - 1;
    var px = seen[back], py = px - back;
    while (x > px && y > py) { ops.push('='); x--; y--; }
    if (d > 0) ops.push(x === px ? '+' : '-');
    x = px; y = py;
  }
  return ops.reverse();
}
function opcodes(ops) {
  var codes = [], i = 0, j = 0, at = 0;
  while (at < ops.length) {
    var same = ops[at] === '=', i1 = i, j1 = j;
    while (at < ops.length && (ops[at] === '=') === same) {
      if (ops[at] !== '+') i++;
      if (ops[at] !== '-') j++;
      at++;
    }
    codes.push([same ? 'equal' : 'change', i1, i, j1, j]);
  }
  return codes;
}
function hunks(codes, n) {
  codes = codes.map(function (c) { return c.slice(); });
  var first = codes[0], last = codes[codes.length - 1], groups = [], group = [];
  if (first[0] === 'equal') { first[1] = Math.max(first[1], first[2] - n);
                              first[3] = Math.max(first[3], first[4] - n); }
  if (last[0] === 'equal') { last[2] = Math.min(last[2], last[1] + n);
                             last[4] = Math.min(last[4], last[3] + n); }
  codes.forEach(function (c) {
    if (c[0] === 'equal' && c[2] - c[1] > 2 * n) {
      group.push(['equal', c[1], Math.min(c[2], c[1] + n), c[3], Math.min(c[4], c[3] + n)]);
      groups.push(group);
      group = [];
      c = ['equal', Math.max(c[1], c[2] - n), c[2], Math.max(c[3], c[4] - n), c[4]];
    }
    group.push(c);
  });
  if (group.length && !(group.length === 1 && group[0][0] === 'equal')) groups.push(group);
  return groups;
}
function span(start, stop) {
  var first = start + 1, length = stop - start;
  if (length === 1) return String(first);
  return (length ? first : first - 1) + ',' + length;
}
function unifiedDiff(path, old, now) {
  var a = splitLines(old), b = splitLines(now), ops = editScript(a, b);
  if (ops === null) return null;
  var codes = opcodes(ops);
  var out = [];
  hunks(codes.length ? codes : [['equal', 0, 1, 0, 1]], 3).forEach(function (group, g) {
    if (g === 0) out.push('--- a/' + path + '\\n', '+++ b/' + path + '\\n');
    var head = group[0], tail = group[group.length - 1];
    out.push('@@ -' + span(head[1], tail[2]) + ' +' + span(head[3], tail[4]) + ' @@\\n');
    group.forEach(function (c) {
      var i;
      if (c[0] === 'equal') { for (i = c[1]; i < c[2]; i++) out.push(' ' + a[i]); return; }
      for (i = c[1]; i < c[2]; i++) out.push('-' + a[i]);
      for (i = c[3]; i < c[4]; i++) out.push('+' + b[i]);
    });
  });
  out = out.map(function (line) {
    return /\\n$/.test(line) ? line : line + '\\n\\\\ No newline at end of file\\n';
  });
  if (out.length > MAX_DIFF_LINES) {
    out = out.slice(0, MAX_DIFF_LINES).concat(
      ['... ' + (out.length - MAX_DIFF_LINES) + ' more lines\\n']);
  }
  return out.join('');
}
"""

SCRIPT = """
(function () {
  var data = JSON.parse(document.getElementById('cairn-data').textContent);
  var detail = document.getElementById('detail');
  var steps = Object.create(null), marks = Object.create(null);
  function has(object, key) { return Object.prototype.hasOwnProperty.call(object, key); }
  data.steps.forEach(function (s) { steps[s.lc] = s; });
  data.checkpoints.forEach(function (m) { marks[m.number] = m; });

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, String(attrs[k])); });
    (children || []).forEach(function (c) {
      node.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
    });
    return node;
  }
  function json(value) {
    return typeof value === 'string' ? value : JSON.stringify(value, null, 1);
  }
  function ms(value) {
    return value >= 1000 ? (value / 1000).toFixed(2) + ' s' : value.toFixed(1) + ' ms';
  }
  function plural(n, one, many) { return n + ' ' + (n === 1 ? one : many || one + 's'); }

  // Counted by the server: failed attempts recorded as they happened count too.
  var retries = data.retries;
  var failed = data.failed;
  var undone = data.steps.filter(function (s) { return s.undone; }).length;
  var restores = data.checkpoints.filter(function (m) { return m.restore; }).length;
  document.getElementById('summary').textContent = data.agents.length + ' agents (' +
    data.agents.join(', ') + '), ' + plural(data.steps.length, 'step') + ' (' + undone +
    ' undone by restores), ' + plural(data.checkpoints.length, 'checkpoint') + ', ' +
    plural(failed, 'failure') + ', ' + plural(retries, 'retry', 'retries') +
    ', ' + plural(restores, 'restore');

  function messageView(m) {
    var who = [m.role, m.name, m.tool_call_id].filter(Boolean).join(' · ');
    var parts = [el('div', {class: 'who'}, [who])];
    if (m.content) parts.push(el('pre', {}, [m.content]));
    (m.tool_calls || []).forEach(function (c) {
      parts.push(el('div', {class: 'call'}, ['→ ' + c.name + ' ' + JSON.stringify(c.args || {})]));
    });
    return el('div', {class: 'msg ' + m.role, 'data-role': m.role}, parts);
  }
  function callsView(records) {
    var rows = [el('tr', {}, ['tool', 'arguments', 'result', 'error', 'effects', 'duration']
      .map(function (h) { return el('th', {}, [h]); }))];
    records.forEach(function (r) {
      rows.push(el('tr', {'data-tool': r.tool}, [
        el('td', {}, [r.tool]), el('td', {}, [el('pre', {}, [json(r.arguments)])]),
        el('td', {}, [el('pre', {}, [r.result === null ? '' : json(r.result)])]),
        el('td', {class: 'err'}, [r.error || '']), el('td', {}, [r.effects || '']),
        el('td', {}, [ms(r.duration_ms)])]));
    });
    return el('table', {class: 'calls'}, rows);
  }
  function show(attrs, children) {
    detail.textContent = '';
    ['data-view', 'data-step', 'data-a', 'data-b'].forEach(function (k) {
      detail.removeAttribute(k);
    });
    Object.keys(attrs).forEach(function (k) { detail.setAttribute(k, String(attrs[k])); });
    children.forEach(function (c) { detail.appendChild(c); });
  }
  function select(selector, on) {
    document.querySelectorAll('.selected,.picked').forEach(function (n) {
      n.classList.remove('selected', 'picked');
    });
    if (!selector) return;
    document.querySelectorAll(selector).forEach(function (n) { n.classList.add(on); });
  }

  function showStep(id) {
    var s = steps[id], h = has(data.histories, id) && data.histories[id];
    if (!s || !h) {
      show({'data-view': 'none'}, [el('p', {}, ['no step ' + id + ' in this task'])]);
      return;
    }
    select('.bar[data-step="' + CSS.escape(id) + '"]', 'selected');
    var records = h[2].map(function (i) { return data.records[i]; });
    var calls = records.filter(function (r) { return r.tool !== null; });
    var usage = s.usage || {};
    var usageRows = ['prompt_tokens', 'completion_tokens', 'cached_tokens', 'cost_usd']
      .filter(function (k) { return has(usage, k); })
      .map(function (k) {
        var value = k === 'cost_usd' ? '$' + Number(usage[k]).toFixed(6) : String(usage[k]);
        return el('tr', {'data-usage': k}, [el('th', {}, [k.split('_').join(' ')]),
                                            el('td', {}, [value])]);
      });
    var facts = 'superstep ' + s.superstep + ' · epoch ' + s.epoch + ' · attempt ' + s.attempt +
      ' · ' + s.status + (s.undone ? ' · undone by a restore' : '') + ' · ' + ms(s.duration_ms) +
      ' · ' + s.started_at + ' → ' + s.finished_at;
    show({'data-view': 'step', 'data-step': id}, [
      el('h2', {}, [s.agent + ' · step ' + s.step]), el('div', {class: 'meta'}, [facts]),
      el('h3', {}, ['Usage']),
      usageRows.length ? el('table', {class: 'usage'}, usageRows)
                       : el('p', {}, ['no model usage recorded']),
      el('h3', {}, ['Messages (' + h[1].length + ')'])
    ].concat(h[1].map(function (i) { return messageView(data.messages[i]); }), [
      el('h3', {}, ['Tool calls (' + calls.length + ')']),
      calls.length ? callsView(calls) : el('p', {}, ['none'])
    ], s.errors.map(function (e) { return el('p', {class: 'err'}, [e]); })));
  }

  function manifest(number) {  // a GC's files: the changes of the GCs up to it, replayed
    var files = Object.create(null);
    for (var i = 0; i < data.checkpoints.length; i++) {
      var m = data.checkpoints[i];
      if (m.files === null) continue;
      Object.keys(m.files.set).forEach(function (p) { files[p] = m.files.set[p]; });
      m.files.removed.forEach(function (p) { delete files[p]; });
      if (m.number === number) return files;
    }
    return files;
  }
  function whole(lc) {  // the agent's whole history at an LC, as pool indexes
    var chain = [], out = {messages: [], trace: []};
    for (var id = lc; id && has(data.histories, id); id = data.histories[id][0]) {
      chain.push(data.histories[id]);
    }
    for (var c = chain.length - 1; c >= 0; c--) {
      chain[c][1].forEach(function (i) { out.messages.push(i); });
      chain[c][2].forEach(function (i) { out.trace.push(i); });
    }
    return out;
  }
  function common(a, b) {  // the length of the prefix two histories share
    var n = 0;
    while (n < a.length && n < b.length && a[n] === b[n]) n++;
    return n;
  }
  function version(sha) {  // a file's content by sha: none (''), or left out of the page (null)
    if (sha === null) return {text: '', binary: false};
    return has(data.files, sha) ? data.files[sha] : {text: null, binary: false};
  }
  function fileDiff(path, change, shaA, shaB, a, b) {
    var va = version(shaA), vb = version(shaB);
    var text;
    if (va.binary || vb.binary) text = 'Binary files a/' + path + ' and b/' + path + ' differ\\n';
    else if (va.text === null || vb.text === null) text = null;
    else text = unifiedDiff(path, va.text, vb.text);
    if (text === null) {
      text = path + ': not diffed in this page (too large, or too many changes); run cairn diff ' +
        data.task + ' ' + a + ' ' + b + '\\n';
    }
    var lines = text.split(/(?<=\\n)/).filter(Boolean).map(function (line) {
      var kind = /^(\\+\\+\\+|---) /.test(line) ? 'head' : /^@@/.test(line) ? 'hunk'
        : line[0] === '+' ? 'add' : line[0] === '-' ? 'del' : 'ctx';
      return el('span', {class: kind}, [line.replace(/\\n$/, '')]);
    });
    return el('div', {class: 'file', 'data-path': path, 'data-change': change}, [
      el('h3', {}, [change + ': ' + path]), el('pre', {class: 'udiff', 'data-path': path}, lines)]);
  }
  function showDiff(a, b) {
    var ma = marks[a], mb = marks[b];
    var bad = [ma, mb].filter(function (m) { return !m || m.files === null; });
    if (bad.length) {
      show({'data-view': 'none'}, [el('p', {}, ['cannot compare GC ' + a + ' with GC ' + b +
        ': only committed checkpoints whose records could be read can be compared'])]);
      return;
    }
    select('.gc-mark[data-gc="' + a + '"],.gc-mark[data-gc="' + b + '"]', 'picked');
    document.getElementById('gc-a').value = String(a);
    document.getElementById('gc-b').value = String(b);
    var parts = [el('h2', {}, ['GC ' + a + ' (superstep ' + ma.superstep + ', epoch ' + ma.epoch +
      ') → GC ' + b + ' (superstep ' + mb.superstep + ', epoch ' + mb.epoch + ')'])];
    var team = data.agents.filter(function (agent) { return has(mb.members, agent); });
    var others = Object.keys(mb.members).filter(function (a) { return team.indexOf(a) < 0; });
    team.concat(others).forEach(function (agent) {
      var hb = whole(mb.members[agent]);
      var ha = has(ma.members, agent) ? whole(ma.members[agent]) : {messages: [], trace: []};
      var messages = hb.messages.slice(common(ha.messages, hb.messages));
      var calls = hb.trace.slice(common(ha.trace, hb.trace))
        .map(function (i) { return data.records[i]; })
        .filter(function (r) { return r.tool !== null; });
      parts.push(el('div', {class: 'agent-diff', 'data-agent': agent,
        'data-messages-added': messages.length, 'data-tool-calls-added': calls.length}, [
        el('h3', {}, [agent + ': ' + plural(messages.length, 'message') + ', ' +
          plural(calls.length, 'tool call') + ' added'])
      ].concat(messages.map(function (i) { return messageView(data.messages[i]); }),
               calls.length ? [callsView(calls)] : [])));
    });
    var fa = manifest(a), fb = manifest(b), files = [];
    Object.keys(fb).sort().forEach(function (p) {
      if (!has(fa, p)) files.push(fileDiff(p, 'added', null, fb[p], a, b));
      else if (fa[p] !== fb[p]) files.push(fileDiff(p, 'changed', fa[p], fb[p], a, b));
    });
    Object.keys(fa).sort().forEach(function (p) {
      if (!has(fb, p)) files.push(fileDiff(p, 'removed', fa[p], null, a, b));
    });
    parts.push(el('h3', {}, ['Files (' + files.length + ' added, removed or changed)']));
    show({'data-view': 'diff', 'data-a': a, 'data-b': b}, parts.concat(files));
  }

  function route() {
    var hash = decodeURIComponent(location.hash.replace(/^#/, '')), found;
    if ((found = /^step=(.+)$/.exec(hash))) showStep(found[1]);
    else if ((found = /^diff=(\\d+),(\\d+)$/.exec(hash))) {
      showDiff(Number(found[1]), Number(found[2]));
    }
  }
  var picked = null;
  document.addEventListener('click', function (event) {
    var step = event.target.closest('[data-step]');
    var gc = event.target.closest('.gc-mark');
    if (step && step !== detail) {
      location.hash = 'step=' + encodeURIComponent(step.getAttribute('data-step'));
    }
    if (!gc) return;
    var n = Number(gc.getAttribute('data-gc'));
    if (picked === null || picked === n) {
      picked = n;
      select('.gc-mark[data-gc="' + n + '"]', 'picked');
      show({'data-view': 'pick'},
           [el('p', {}, ['GC ' + n + ' picked: click another checkpoint to compare'])]);
      return;
    }
    location.hash = 'diff=' + Math.min(picked, n) + ',' + Math.max(picked, n);
    picked = null;
  });
  ['gc-a', 'gc-b'].forEach(function (id) {
    document.getElementById(id).addEventListener('change', function () {
      var a = document.getElementById('gc-a').value, b = document.getElementById('gc-b').value;
      if (a !== '' && b !== '' && a !== b) location.hash = 'diff=' + a + ',' + b;
    });
  });
  var zoom = 1, chart = document.getElementById('chart');
  document.querySelectorAll('[data-zoom]').forEach(function (button) {
    button.addEventListener('click', function () {
      var how = button.getAttribute('data-zoom');
      zoom = how === 'fit' ? 1 : Math.max(1, Math.min(64, zoom * (how === 'in' ? 2 : 0.5)));
      chart.style.width = (zoom * 100) + '%';
    });
  });
  window.addEventListener('hashchange', route);
  route();
  if (window.cairnErrors.length === 0) {
    var ok = document.createElement('div');
    ok.id = 'cairn-ok';
    ok.setAttribute('data-agents', String(data.agents.length));
    ok.hidden = true;
    document.body.appendChild(ok);
  }
})();
"""
