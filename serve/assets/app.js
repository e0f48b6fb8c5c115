// LoopX dashboard: one page, no framework, no build step. Everything shown comes from the JSON
// API under /api/v1/ and is put on the page as text nodes (textContent), never parsed as HTML:
// titles, evidence and summaries are written by agents and plugins. Characters that would hide
// or reorder text (controls, bidi overrides, invisible ones) are shown as escapes, as the CLI
// shows them; the server prepends their set (`HIDDEN`, from loopx::inert::is_hidden).
'use strict';

const API = '/api/v1';
const view = document.getElementById('view');
const live = document.getElementById('live');
let renderSeq = 0;

// ---- building blocks -------------------------------------------------------------------------

// el('td', {class: 'x'}, 'text', otherNode): strings become text nodes, never markup.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'href') node.setAttribute('href', v);
    else node.setAttribute(k, String(v));
  }
  append(node, children);
  return node;
}

// Text as the CLI's inert module shows it: each hidden character as \n, \r, \t or \u{hex}
// (a line break and a tab kept where the text is multi-line).
function inert(s, multiline) {
  return String(s).replace(HIDDEN, c => {
    if (multiline && (c === '\n' || c === '\t')) return c;
    if (c === '\n') return '\\n';
    if (c === '\r') return '\\r';
    if (c === '\t') return '\\t';
    return '\\u{' + c.codePointAt(0).toString(16) + '}';
  });
}

function append(node, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null) continue;
    node.appendChild(c instanceof Node ? c : document.createTextNode(inert(c)));
  }
}

// A link to a permalink inside the page; every id is encoded, so no id can leave its segment.
function link(text, ...parts) {
  return el('a', { href: '#/' + parts.map(encodeURIComponent).join('/') }, text);
}

function table(headers, rows) {
  if (!rows.length) return el('p', { class: 'muted' }, 'none');
  return el('table', {},
    el('thead', {}, el('tr', {}, headers.map(h => el('th', {}, h)))),
    el('tbody', {}, rows));
}

function row(cells, attrs) {
  return el('tr', attrs || {}, cells.map(c => el('td', {}, c)));
}

function fields(pairs) {
  const dl = el('dl', { class: 'fields' });
  for (const [k, v] of pairs) {
    if (v === undefined) continue;
    dl.appendChild(el('dt', {}, k));
    dl.appendChild(el('dd', {}, v === null ? '-' : v));
  }
  return dl;
}

function text(v) {
  if (v === null || v === undefined) return '-';
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

function json(v) {
  const pre = el('pre');
  pre.textContent = inert(JSON.stringify(v, null, 2), true);
  return pre;
}

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || ('HTTP ' + status));
    this.status = status;
  }
}

async function api(path) {
  const res = await fetch(API + path, { credentials: 'same-origin', cache: 'no-store' });
  let body = null;
  try { body = await res.json(); } catch (_) { body = null; }
  if (!res.ok || !body || body.ok === false) throw new ApiError(res.status, body);
  return body;
}

// Milliseconds until an RFC 3339 time, as "4m 10s" (negative: "expired").
function timeLeft(iso) {
  if (!iso) return '-';
  const ms = Date.parse(iso) - Date.now();
  if (Number.isNaN(ms)) return text(iso);
  if (ms <= 0) return 'expired';
  const s = Math.round(ms / 1000);
  const m = Math.floor(s / 60);
  return m ? `${m}m ${s % 60}s` : `${s}s`;
}

function shellQuote(s) {
  return /^[A-Za-z0-9._:/-]+$/.test(s) ? s : "'" + String(s).replace(/'/g, "'\\''") + "'";
}

function gateCommand(goalId, todoId) {
  return `loopx gate resolve --goal-id ${shellQuote(goalId)} --todo-id ${shellQuote(todoId)} --comment "..."`;
}

// ---- pages -----------------------------------------------------------------------------------

async function attentionPage() {
  const s = await api('/status');
  const items = s.attention.map(a => row([
    el('span', { class: 'badge ' + a.who }, a.who),
    a.kind,
    link(a.goal_id, 'goals', a.goal_id),
    a.todo_id ? link(a.todo_id, 'goals', a.goal_id, 'todos', a.todo_id) : '-',
    a.title,
    a.reason,
  ], { 'data-goal': a.goal_id, 'data-todo': a.todo_id || '' }));
  const goals = s.goals.map(g => row([
    link(g.goal.id, 'goals', g.goal.id),
    g.goal.title,
    g.goal.status,
    String(g.ready_count),
    g.top_agent_todo ? link(g.top_agent_todo.title, 'goals', g.goal.id, 'todos', g.top_agent_todo.id) : '-',
    `${g.quota.spent_slots}/${g.quota.allowed_slots} ${g.quota.state}`,
    g.latest_run_id ? link(g.latest_run_id, 'goals', g.goal.id, 'runs', g.latest_run_id) : '-',
  ]));
  return [
    el('h1', {}, 'Attention queue'),
    el('p', { class: 'muted' }, 'Who must act next, on which goal.'),
    table(['who', 'kind', 'goal', 'todo', 'title', 'why'], items),
    el('h2', {}, 'Goals'),
    table(['goal', 'title', 'status', 'ready', 'top agent todo', 'quota', 'latest run'], goals),
  ];
}

async function goalsPage() {
  const g = await api('/goals');
  const rows = g.goals.map(goal => row([
    link(goal.id, 'goals', goal.id), goal.title, goal.status, goal.updated_at,
  ]));
  return [el('h1', {}, 'Goals'), table(['goal', 'title', 'status', 'updated'], rows)];
}

function leaseCells(t) {
  const c = t.claim;
  if (!c) return ['-', '-', '-'];
  return [text(c.agent_id), text(c.fence), timeLeft(c.expires_at)];
}

async function goalPage(goalId) {
  const enc = encodeURIComponent(goalId);
  const [g, gates, quota] = await Promise.all([
    api(`/goals/${enc}`), api(`/goals/${enc}/gates`), api(`/goals/${enc}/quota`),
  ]);
  const goal = g.goal;
  const todos = (g.todos || []).map(t => row([
    link(t.id, 'goals', goalId, 'todos', t.id),
    t.title,
    t.status,
    t.kind,
    t.priority,
    ...leaseCells(t),
    (t.depends_on || []).length
      ? (t.depends_on).map((d, i) => [i ? ', ' : '', link(d, 'goals', goalId, 'todos', d)])
      : '-',
  ], { 'data-todo': t.id }));
  const gateRows = (gates.gates || []).map(t => row([
    link(t.id, 'goals', goalId, 'todos', t.id),
    t.kind,
    t.status,
    t.title,
    el('code', { class: 'cmd' }, gateCommand(goalId, t.id)),
  ]));
  return [
    el('h1', {}, 'Goal ', goal.id),
    fields([
      ['title', goal.title], ['status', goal.status], ['objective', goal.objective],
      ['success criteria', text(goal.success_criteria)], ['next probe', goal.next_probe],
      ['updated', goal.updated_at],
    ]),
    el('p', {}, link('Run history', 'goals', goalId, 'history'), ' · ',
      el('a', { href: '#/turns?goal_id=' + enc }, 'Turns')),
    el('h2', {}, 'Todos'),
    table(['todo', 'title', 'status', 'kind', 'priority', 'lease holder', 'fence', 'time left',
      'depends on'], todos),
    el('h2', {}, 'Gates and user actions'),
    el('p', { class: 'muted' },
      'The dashboard cannot resolve a gate: run the command shown in a terminal, as the operator.'),
    table(['todo', 'kind', 'status', 'title', 'resolve with'], gateRows),
    el('h2', {}, 'Quota'),
    quotaSection(quota),
  ];
}

// The spend over the rolling window (`spend_series` of `quota show`: net slots in each equal span
// of the window, oldest first), as an inline SVG: a bar per span, scaled to the busiest span, in
// the lower band, and the running total through the window as a step line against the limit
// (dashed) on one scale, so the line ends at the window's spent slots.
function quotaSection(q) {
  const v = q.quota;
  const series = q.spend_series;
  const spans = series.net_slots;
  const start = Date.parse(series.window_start);
  const end = Date.parse(series.window_end);
  const spanMs = (end - start) / spans.length;
  const W = 560, H = 180, P = 28, BAND = 36;
  const totals = [];
  spans.reduce((sum, n, i) => (totals[i] = sum + n), 0);
  const top = Math.max(v.allowed_slots || 0, ...totals, 1);
  const busiest = Math.max(...spans, 1);
  const x = i => P + (W - 2 * P) * i / spans.length;
  const y = n => H - P - (H - 2 * P) * Math.max(n, 0) / top;
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'plot');
  svg.setAttribute('width', W);
  svg.setAttribute('height', H);
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', 'slot spend over the rolling window');
  const add = (parent, tag, attrs, content) => {
    const n = document.createElementNS(ns, tag);
    for (const [k, val] of Object.entries(attrs)) n.setAttribute(k, String(val));
    if (content !== undefined) n.textContent = inert(content);
    parent.appendChild(n);
    return n;
  };
  const clock = t => new Date(t).toISOString().slice(11, 16);
  spans.forEach((n, i) => {
    const h = n > 0 ? Math.max(1, BAND * n / busiest) : 0;
    const bar = add(svg, 'rect', { class: 'bucket', 'data-slots': n, x: x(i) + 0.5,
      y: H - P - h, width: Math.max(1, x(i + 1) - x(i) - 1), height: h });
    add(bar, 'title', {}, `${clock(start + i * spanMs)}–${clock(start + (i + 1) * spanMs)} UTC: ${n} slot(s)`);
  });
  let d = `M${x(0)},${y(0).toFixed(1)}`;
  totals.forEach((total, i) => { d += ` V${y(total).toFixed(1)} H${x(i + 1).toFixed(1)}`; });
  add(svg, 'line', { class: 'cap', x1: P, x2: W - P, y1: y(v.allowed_slots), y2: y(v.allowed_slots) });
  add(svg, 'path', { class: 'spend', d });
  add(svg, 'text', { x: P, y: H - 8 }, `-${((end - start) / 3600e3).toFixed(0)}h`);
  add(svg, 'text', { x: W - P - 20, y: H - 8 }, 'now');
  add(svg, 'text', { x: 2, y: y(v.allowed_slots) + 3 }, String(v.allowed_slots));
  add(svg, 'text', { x: W - P + 2, y: H - P - BAND + 8 }, String(busiest));
  return el('div', {},
    fields([
      ['state', v.state], ['spent', `${v.spent_slots} of ${v.allowed_slots} slots`],
      ['reserved', text(v.reserved_slots)], ['remaining', text(v.remaining_slots)],
      ['window', `${text(v.policy && v.policy.window_hours)} h`],
    ]),
    svg,
    el('p', { class: 'muted' },
      `Bars: net slots spent in each of the window's ${spans.length} spans of ` +
      `${Math.round(series.bucket_seconds / 60)} min (tallest: ${busiest}). ` +
      'Line: the running total through the window; dashed: the limit.'));
}

async function todoPage(goalId, todoId) {
  const t = await api(`/goals/${encodeURIComponent(goalId)}/todos/${encodeURIComponent(todoId)}`);
  const todo = t.todo;
  const evidence = (t.evidence || []).map(e => row([e.created_at, e.actor, e.text,
    e.run_id ? link(e.run_id, 'goals', goalId, 'runs', e.run_id) : '-']));
  const isGate = todo.role === 'user' || /gate|action/.test(todo.kind || '');
  return [
    el('h1', {}, 'Todo ', todo.id, ' of ', link(goalId, 'goals', goalId)),
    fields([
      ['title', todo.title], ['status', todo.status], ['kind', todo.kind],
      ['priority', todo.priority], ['detail', text(todo.detail)],
      ['lease holder', todo.claim ? text(todo.claim.agent_id) : '-'],
      ['fence', todo.claim ? text(todo.claim.fence) : '-'],
      ['time left', todo.claim ? timeLeft(todo.claim.expires_at) : '-'],
      ['depends on', (todo.depends_on || []).length
        ? todo.depends_on.map((d, i) => [i ? ', ' : '', link(d, 'goals', goalId, 'todos', d)]) : '-'],
    ]),
    isGate && todo.status !== 'completed'
      ? el('p', {}, 'Resolve in a terminal: ', el('code', { class: 'cmd' }, gateCommand(goalId, todo.id)))
      : null,
    el('h2', {}, 'Evidence'),
    table(['when', 'actor', 'text', 'run'], evidence),
  ];
}

async function historyPage(goalId, before) {
  const q = new URLSearchParams({ limit: '25' });
  if (before) q.set('before', before);
  const h = await api(`/goals/${encodeURIComponent(goalId)}/history?${q}`);
  const rows = h.runs.map(r => row([
    link(r.run_id, 'goals', goalId, 'runs', r.run_id),
    r.created_at, r.classification, text(r.agent_id),
    r.todo_id ? link(r.todo_id, 'goals', goalId, 'todos', r.todo_id) : '-',
    (r.rewards || []).map(w => (w.score > 0 ? '+' : '') + w.score).join(', ') || '-',
    r.summary,
  ]));
  const pager = el('p', { class: 'pager' });
  if (before) append(pager, [link('Newest', 'goals', goalId, 'history'), ' · ']);
  if (h.runs.length && h.next_before) {
    append(pager, [link('Older runs', 'goals', goalId, 'history', 'before', h.next_before)]);
  }
  return [
    el('h1', {}, 'Run history of ', link(goalId, 'goals', goalId)),
    table(['run', 'when', 'classification', 'agent', 'todo', 'rewards', 'summary'], rows),
    pager,
  ];
}

async function runPage(goalId, runId) {
  const r = await api(`/goals/${encodeURIComponent(goalId)}/runs/${encodeURIComponent(runId)}`);
  const run = r.run;
  return [
    el('h1', {}, 'Run ', run.run_id),
    fields([
      ['goal', link(goalId, 'goals', goalId)], ['when', run.created_at],
      ['classification', run.classification], ['outcome', text(run.outcome)],
      ['agent', text(run.agent_id)],
      ['todo', run.todo_id ? link(run.todo_id, 'goals', goalId, 'todos', run.todo_id) : '-'],
      ['summary', run.summary],
    ]),
    el('h2', {}, 'Rewards'),
    table(['when', 'score', 'comment', 'by'], (run.rewards || []).map(w => row([
      when(w.created_at), (w.score > 0 ? '+' : '') + w.score, w.comment, text(w.actor),
    ], { class: 'reward' }))),
    el('h2', {}, 'Evidence'),
    el('p', { class: 'muted' }, run.todo_id
      ? 'What the todo held when this run was recorded (the newest 50), oldest first.'
      : 'This run names no todo.'),
    table(['when', 'actor', 'text', 'artifact'], (r.evidence || []).map(e => row([
      e.created_at, e.actor, e.text,
      e.artifact_path ? [e.artifact_path, e.artifact_digest ? ' ' + e.artifact_digest : ''] : '-',
    ], { class: 'evidence' }))),
    el('h2', {}, 'Payload'),
    json(run.payload),
  ];
}

// A turn in progress is stuck once no phase has committed for twice its host's timeout plus 5 s
// (its driver would have stopped the host and moved on by then: the driver is gone or hung), or
// for 10 minutes when the journal holds no timeout.
const STUCK_FALLBACK_MS = 10 * 60e3;

function when(v) {
  if (typeof v === 'number') return new Date(v).toISOString();
  return text(v);
}

function isStuck(t) {
  if (t.status !== 'in_progress') return false;
  const updated = typeof t.updated_at === 'number' ? t.updated_at : Date.parse(t.updated_at);
  const timeout = t.data && typeof t.data.timeout_ms === 'number' ? t.data.timeout_ms : null;
  const limit = timeout === null ? STUCK_FALLBACK_MS : 2 * timeout + 5000;
  return Number.isNaN(updated) || Date.now() - updated > limit;
}

async function turnsPage(params) {
  const q = new URLSearchParams({ limit: '100' });
  if (params.get('goal_id')) q.set('goal_id', params.get('goal_id'));
  const t = await api(`/turns?${q}`);
  const rows = (t.turns || []).map(turn => row([
    link(turn.turn_key, 'turns', turn.turn_key),
    link(turn.goal_id, 'goals', turn.goal_id),
    turn.todo_id ? link(turn.todo_id, 'goals', turn.goal_id, 'todos', turn.todo_id) : '-',
    text(turn.agent_id), turn.status + (isStuck(turn) ? ' (stuck)' : ''),
    (turn.phases || []).join(' → ') || '-',
    when(turn.updated_at),
  ], isStuck(turn) ? { class: 'stuck' } : {}));
  return [
    el('h1', {}, 'Turn journal'),
    el('p', { class: 'muted' }, 'Newest first; a turn in progress with no phase committed for twice its host timeout (plus 5 s) is highlighted as stuck.'),
    table(['turn', 'goal', 'todo', 'agent', 'status', 'phases', 'updated'], rows),
  ];
}

async function turnPage(key) {
  const t = await api(`/turns/${encodeURIComponent(key)}`);
  const turn = t.journal;
  const d = turn.data || {};
  return [
    el('h1', {}, 'Turn ', turn.turn_key),
    fields([
      ['goal', link(turn.goal_id, 'goals', turn.goal_id)], ['agent', text(turn.agent_id)],
      ['todo', turn.todo_id ? link(turn.todo_id, 'goals', turn.goal_id, 'todos', turn.todo_id) : '-'],
      ['status', turn.status + (isStuck(turn) ? ' (stuck)' : '')],
      ['kind', text(d.kind)], ['failure', text(d.failure)],
      ['run', d.run_id ? link(d.run_id, 'goals', turn.goal_id, 'runs', d.run_id) : '-'],
      ['created', when(turn.created_at)], ['updated', when(turn.updated_at)],
    ]),
    el('h2', {}, 'Phases'),
    table(['#', 'phase'], (turn.phases || []).map((p, i) => row([String(i + 1), p]))),
    el('h2', {}, 'Journal data'),
    json(d),
  ];
}

async function extensionsPage() {
  const x = await api('/extensions');
  const rows = (x.extensions || []).map(e => row([
    link(e.id, 'extensions', e.id), text(e.version), text(e.revision),
    e.enabled === false ? 'disabled' : 'enabled',
    (e.components || []).map(c => `${text(c.kind)} ${text(c.name)}`).join(', '),
  ]));
  return [el('h1', {}, 'Extensions'), table(['extension', 'version', 'revision', 'state', 'components'], rows)];
}

async function extensionPage(id) {
  const x = await api(`/extensions/${encodeURIComponent(id)}`);
  const e = x.extension;
  return [
    el('h1', {}, 'Extension ', e.id),
    fields([['version', text(e.version)], ['revision', text(e.revision)],
      ['enabled', text(e.enabled)]]),
    el('h2', {}, 'Components, digests and limits'),
    table(['component', 'kind', 'sha256', 'uses', 'limits'], (e.components || []).map(c => row([
      text(c.name), text(c.kind), el('code', {}, text(c.sha256)), text(c.uses), el('code', {}, text(c.limits)),
    ]))),
    el('h2', {}, 'Grants'),
    json(e.grants),
    el('h2', {}, 'Revisions'),
    table(['revision', 'version', 'installed'], (x.revisions || []).map(r =>
      row([text(r.revision), text(r.version), text(r.installed_at)]))),
  ];
}

// ---- routing and live updates ----------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#\/?/, '');
  const [path, query] = hash.split('?');
  const p = path.split('/').filter(Boolean).map(decodeURIComponent);
  const params = new URLSearchParams(query || '');
  if (!p.length) return attentionPage();
  if (p[0] === 'goals') {
    if (p.length === 1) return goalsPage();
    if (p.length === 2) return goalPage(p[1]);
    if (p[2] === 'todos' && p[3]) return todoPage(p[1], p[3]);
    if (p[2] === 'runs' && p[3]) return runPage(p[1], p[3]);
    if (p[2] === 'history') return historyPage(p[1], p[3] === 'before' ? p[4] : null);
  }
  if (p[0] === 'turns') return p[1] ? turnPage(p[1]) : turnsPage(params);
  if (p[0] === 'extensions') return p[1] ? extensionPage(p[1]) : extensionsPage();
  return Promise.resolve([el('h1', {}, 'Not found'), el('p', {}, 'No page at this address.')]);
}

let rendering = null;
let again = false;

// Renders the current page; a render asked for during one runs once after it.
async function render() {
  if (rendering) { again = true; return rendering; }
  rendering = (async () => {
    do {
      again = false;
      let nodes;
      try {
        nodes = await route();
      } catch (e) {
        nodes = [el('h1', {}, 'Error'), el('p', { class: 'error' }, e.message)];
      }
      view.replaceChildren(...[nodes].flat().filter(Boolean));
      renderSeq += 1;
      document.documentElement.dataset.renderSeq = String(renderSeq);
      document.documentElement.dataset.renderedAt = String(Date.now());
    } while (again);
  })();
  try { await rendering; } finally { rendering = null; }
}

function connect() {
  const source = new EventSource(API + '/events');
  source.addEventListener('ready', () => { live.textContent = 'live'; live.className = 'live on'; });
  source.addEventListener('change', () => { render(); });
  // EventSource reconnects by itself after a dropped connection; the page re-fetches once it is
  // back. An answer other than a stream (a server at its stream limit says 503) closes it for
  // good, so the page opens a new one a few seconds later.
  source.onerror = () => {
    live.textContent = 'reconnecting';
    live.className = 'live off';
    if (source.readyState === EventSource.CLOSED) setTimeout(connect, 3000);
  };
  source.onopen = () => { render(); };
}

window.addEventListener('hashchange', render);
render();
connect();
