// The dashboard in a real browser: the system Chromium driven by playwright-core.
//
// Seeds a project with the built `loopx` (LOOPX_BIN, default target/debug/loopx), starts
// `loopx serve` on a free loopback port, loads every page and follows its links, checks that a
// claim made from the CLI shows up without a reload (and how long that took), that hostile
// titles, evidence and run summaries render as text, and writes screenshots of the attention
// queue and a goal page into docs/screenshots/. Run from the repository root:
//
//   cargo build && (cd tests/browser && npm install) && node tests/browser/dashboard.test.mjs
//
// Exits 0 when every check passed; prints each check and the measured latency.

import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const loopx = process.env.LOOPX_BIN || join(repo, 'target/debug/loopx');
const chromiumPath = process.env.CHROMIUM || '/usr/bin/chromium';
const screenshots = process.env.LOOPX_SCREENSHOTS || join(repo, 'docs/screenshots');
const LATENCY_LIMIT_MS = 500;

const HOSTILE_TITLE = 'Ship <img src=x onerror=alert(1)> \u202Eevil';
const HOSTILE_TODO = 'Fix <script>alert(2)</script> now';
const HOSTILE_EVIDENCE = '<img src=x onerror=alert(3)> proof';
const HOSTILE_SUMMARY = '<b>bold</b><svg onload=alert(4)> summary';
const HOSTILE_COMMENT = '<img src=x onerror=alert(5)> well \u202Edone';

// How the page shows a value: as text, with bidi and other hidden characters as escapes.
const shown = s => s.replace(/\u202E/g, '\\u{202e}');

const project = mkdtempSync(join(tmpdir(), 'loopx-browser-'));
const profile = mkdtempSync(join(tmpdir(), 'loopx-chromium-'));
let server;
let context;

function cli(...args) {
  const out = spawnSync(loopx, ['--root', project, ...args], { encoding: 'utf8' });
  if (out.status !== 0) {
    throw new Error(`loopx ${args.join(' ')} exited ${out.status}: ${out.stderr}`);
  }
  return out.stdout;
}

function seed() {
  cli('init');
  cli('goal', 'create', '--id', 'g1', '--title', HOSTILE_TITLE);
  cli('goal', 'create', '--id', 'g2', '--title', 'A quiet second goal');
  cli('todo', 'add', '--goal-id', 'g1', '--id', 't1', '--title', HOSTILE_TODO);
  cli('todo', 'add', '--goal-id', 'g1', '--id', 't2', '--title', 'Depends on t1', '--depends-on', 't1');
  cli('todo', 'add', '--goal-id', 'g1', '--id', 't3', '--title', 'Claimed live from the CLI');
  cli('todo', 'add', '--goal-id', 'g1', '--id', 'gate1', '--title', 'Approve the release',
    '--kind', 'user_gate', '--blocks-agent', 'dave');
  const claim = JSON.parse(cli('--format', 'json', 'todo', 'claim', '--goal-id', 'g1',
    '--todo-id', 't1', '--agent-id', 'bob'));
  const fence = String(claim.claim.fence);
  cli('todo', 'update', '--goal-id', 'g1', '--todo-id', 't1', '--agent-id', 'bob', '--fence', fence,
    '--evidence', HOSTILE_EVIDENCE);
  const run = JSON.parse(cli('--format', 'json', 'refresh-state', '--goal-id', 'g1', '--agent-id', 'bob',
    '--todo-id', 't1', '--classification', 'progress', '--summary', HOSTILE_SUMMARY));
  cli('quota', 'spend-slot', '--goal-id', 'g1', '--agent-id', 'bob');
  const runId = run.run_id || (run.run && (run.run.run_id || run.run.id));
  assert.ok(runId, 'refresh-state names its run');
  cli('reward', 'add', '--goal-id', 'g1', '--run-id', runId, '--score', '3', '--comment', HOSTILE_COMMENT);
  // One real turn in the journal: a host that reports the todo done.
  cli('todo', 'add', '--goal-id', 'g1', '--id', 't4', '--title', 'Worked in a turn');
  const result = JSON.stringify({ schema_version: 'loopx.turn_result.v1', status: 'completed',
    summary: 'turn summary', evidence: [{ text: 'turn evidence' }] });
  const turn = JSON.parse(cli('--format', 'json', 'turn', 'run', '--goal-id', 'g1', '--agent-id', 'erin',
    '--todo-id', 't4', '--isolation', 'off', '--trust-host-completion', '--', '/bin/echo', result));
  assert.ok(turn.turn && turn.turn.turn_key, 'the turn ran');
  installExtension();
  const stuckKey = stuckTurn();
  return { runId, turnKey: turn.turn.turn_key, stuckKey, spans: spendOverTheWindow() };
}

// Spends in two different spans of g2's window: a 3-minute window (48 spans of 3.75 s), 2 slots,
// then 1 slot a span and more later. Returns the spans each landed in, as the API names them.
function spendOverTheWindow() {
  cli('quota', 'set', '--goal-id', 'g2', '--window-hours', '0.05', '--allowed-slots', '10');
  cli('quota', 'spend-slot', '--goal-id', 'g2', '--agent-id', 'bob', '--slots', '2', '--effect-id', 'seed-1');
  spawnSync('sleep', ['4']);
  cli('quota', 'spend-slot', '--goal-id', 'g2', '--agent-id', 'bob', '--slots', '1', '--effect-id', 'seed-2');
  const q = JSON.parse(cli('--format', 'json', 'quota', 'show', '--goal-id', 'g2'));
  const busy = q.spend_series.net_slots.map((n, i) => [i, n]).filter(([, n]) => n !== 0);
  assert.equal(busy.length, 2, `two spans hold the spends: ${JSON.stringify(q.spend_series)}`);
  return busy;
}

// The first-party provider fs-observe, installed with a grant (built first if it is not).
function installExtension() {
  const component = join(repo, 'target/wasm32-wasip2/release/fs_observe.wasm');
  if (!existsSync(component)) {
    const built = spawnSync('cargo', ['build', '--release', '--target', 'wasm32-wasip2', '-p', 'fs-observe'],
      { cwd: repo, stdio: 'inherit' });
    if (built.status !== 0) throw new Error('building fs-observe failed (rustup target add wasm32-wasip2)');
  }
  const workspace = join(project, 'workspace');
  mkdirSync(workspace, { recursive: true });
  cli('extension', 'install', join(repo, 'extensions/fs-observe'), '--grant', `fs.read:workspace=${workspace}`);
}

// A turn whose driver died mid-host (SIGKILL): its journal row stays in progress. Returns its key.
function stuckTurn() {
  cli('todo', 'add', '--goal-id', 'g1', '--id', 't6', '--title', 'Its driver was killed');
  const driver = spawn(loopx, ['--root', project, 'turn', 'run', '--goal-id', 'g1', '--agent-id',
    'frank', '--todo-id', 't6', '--isolation', 'off', '--timeout-seconds', '1', '--', '/bin/sleep', '3'],
  { stdio: 'ignore' });
  for (let i = 0; i < 200; i++) {
    const list = JSON.parse(cli('--format', 'json', 'turn', 'list', '--status', 'in_progress'));
    const mine = list.turns.find(t => t.agent_id === 'frank');
    if (mine) {
      driver.kill('SIGKILL');
      return mine.turn_key;
    }
    spawnSync('sleep', ['0.05']);
  }
  driver.kill('SIGKILL');
  throw new Error('the turn never showed in the journal');
}

async function startServer(listen = '127.0.0.1:0') {
  server = spawn(loopx, ['--root', project, 'serve', '--listen', listen], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const lines = createInterface({ input: server.stdout });
  for await (const line of lines) {
    const m = line.match(/http:\/\/(\S+?)\/?$/);
    if (m) return `http://${m[1]}`;
  }
  throw new Error('loopx serve exited before it printed its address');
}

const checks = [];
function ok(name) {
  checks.push(name);
  console.log(`ok ${checks.length} - ${name}`);
}

async function main() {
  const { runId, turnKey, stuckKey, spans } = seed();
  const stuckSince = Date.now();
  const base = await startServer();
  ok(`loopx serve listens at ${base}`);

  context = await chromium.launchPersistentContext(profile, {
    executablePath: chromiumPath,
    headless: true,
    viewport: { width: 1280, height: 800 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--disable-quic', '--no-first-run'],
  });
  const page = context.pages()[0] || await context.newPage();
  const dialogs = [];
  const errors = [];
  const foreign = [];
  page.on('dialog', d => { dialogs.push(d.message()); d.dismiss(); });
  page.on('pageerror', e => errors.push(String(e)));
  page.on('request', r => { if (!r.url().startsWith(base)) foreign.push(r.url()); });

  const rendered = async () => Number(await page.evaluate(() => document.documentElement.dataset.renderSeq || 0));
  async function open(hash) {
    const before = await rendered();
    await page.goto(`${base}/${hash}`);
    await page.waitForFunction(n => Number(document.documentElement.dataset.renderSeq || 0) > n, before);
  }
  async function follow(selector) {
    const before = await rendered();
    await page.click(selector);
    await page.waitForFunction(n => Number(document.documentElement.dataset.renderSeq || 0) > n, before);
  }
  const bodyText = () => page.evaluate(() => document.getElementById('view').textContent);

  // The attention queue, and its links.
  await open('#/');
  await page.waitForSelector('#live.on');
  let text = await bodyText();
  assert.match(text, /Attention queue/);
  assert.ok(text.includes('Approve the release'), 'the gate is in the attention queue');
  assert.ok(text.includes(shown(HOSTILE_TITLE)), 'the hostile goal title is shown as text');
  assert.ok(!text.includes('\u202E'), 'no bidi override reaches the page');
  ok('attention queue lists the gate and shows the hostile title as text, its bidi override escaped');
  await page.screenshot({ path: join(screenshots, 'attention-queue.png') });

  // The quota plot of the goal with spends in two spans of its short window: one bar per span,
  // the two spends in theirs, the running total ending at the window's spent slots.
  await open('#/goals/g2');
  assert.equal(await page.locator('svg.plot rect.bucket').count(), 48, 'one bar per span of the window');
  const bars = await page.$$eval('svg.plot rect.bucket', rs => rs.map(r => Number(r.dataset.slots)));
  const drawn = bars.map((n, i) => [i, n]).filter(([, n]) => n !== 0);
  assert.deepEqual(drawn.map(([, n]) => n), [2, 1], 'the spends, oldest first');
  // The window moved on since the seed read it: the spends sit as many spans apart as they did
  // (give or take the one a span boundary may fall between).
  const apart = drawn[1][0] - drawn[0][0];
  assert.ok(apart >= 1 && Math.abs(apart - (spans[1][0] - spans[0][0])) <= 1,
    `the spends are ${apart} span(s) apart; the seed saw ${JSON.stringify(spans)}`);
  const bar = i => page.locator('svg.plot rect.bucket').nth(i);
  assert.ok(Number(await bar(drawn[0][0]).getAttribute('height')) >
    Number(await bar(drawn[1][0]).getAttribute('height')), 'bars scale with the slots');
  const steps = await page.locator('svg.plot path.spend').getAttribute('d');
  assert.equal((steps.match(/H/g) || []).length, 48, 'the running total has one step per span');
  assert.ok((await bodyText()).includes('3 of 10 slots'), 'spent against the limit');
  ok('quota plot: one bar per span of the window, the seeded spends in their spans, against the limit');

  await open('#/');
  await follow('main a[href="#/goals/g1"]');
  assert.equal(await page.evaluate(() => location.hash), '#/goals/g1');
  text = await bodyText();
  for (const want of [HOSTILE_TODO, 'bob', 'Depends on t1', 't1', 'loopx gate resolve --goal-id g1 --todo-id gate1 --comment "..."',
    'Depends on t1']) {
    assert.ok(text.includes(want), `the goal page shows ${want}`);
  }
  assert.equal(await page.locator('svg.plot path.spend').count(), 1, 'the quota plot is drawn');
  assert.equal(await page.locator('tr[data-todo="t2"] a[href="#/goals/g1/todos/t1"]').count(), 1,
    't2 links the todo it depends on');
  ok('goal page: todos, lease holder, dependencies, gate command, quota plot');
  await page.screenshot({ path: join(screenshots, 'goal.png'), fullPage: true });

  await follow('main a[href="#/goals/g1/todos/t1"]');
  text = await bodyText();
  assert.ok(text.includes(HOSTILE_EVIDENCE), 'hostile evidence shown as text');
  ok('todo permalink shows its evidence as text');

  await open('#/goals/g1/history');
  text = await bodyText();
  assert.ok(text.includes(HOSTILE_SUMMARY), 'hostile run summary shown as text');
  assert.ok(text.includes('+3'), 'the reward is shown');
  await follow(`main a[href="#/goals/g1/runs/${runId}"]`);
  text = await bodyText();
  assert.ok(text.includes(runId) && text.includes(HOSTILE_SUMMARY));
  const reward = await page.locator('tr.reward').textContent();
  assert.ok(reward.includes('+3') && reward.includes(shown(HOSTILE_COMMENT)),
    `the run page shows the reward's score and comment as text: ${reward}`);
  assert.ok(!reward.includes('\u202E'), 'no bidi override reaches the page');
  const evidence = await page.locator('tr.evidence').allTextContents();
  assert.ok(evidence.some(e => e.includes(HOSTILE_EVIDENCE)), `the run page shows its evidence: ${evidence}`);
  assert.equal(await page.locator('main img, main script, main b, main svg').count(), 0,
    'nothing the run page shows became an element');
  assert.deepEqual(dialogs, [], 'no hostile text ran');
  ok('history page with rewards, and the run report permalink with its reward and evidence, inert');

  await open('#/turns');
  text = await bodyText();
  assert.ok(text.includes(turnKey) && text.includes('erin'), 'the turn is listed');
  await follow(`main a[href="#/turns/${turnKey}"]`);
  text = await bodyText();
  assert.ok(text.includes('Phases') && text.includes('committed'), 'the turn page shows its phases');
  assert.ok(await page.locator('main table tbody tr').count() > 1, 'one row per committed phase');
  ok('turn journal lists the turn; its permalink shows the phases');

  // The killed driver's turn is highlighted once it is past twice its 1 s timeout plus 5 s.
  await new Promise(r => setTimeout(r, Math.max(0, stuckSince + 7500 - Date.now())));
  await open('#/turns');
  assert.equal(await page.locator(`tr.stuck a[href="#/turns/${stuckKey}"]`).count(), 1,
    'the turn whose driver died is highlighted as stuck');
  assert.equal(await page.locator(`tr.stuck a[href="#/turns/${turnKey}"]`).count(), 0,
    'a committed turn is not');
  ok('a turn whose driver was killed is highlighted as stuck');

  await open('#/extensions');
  await follow('main a[href="#/extensions/fs-observe"]');
  text = await bodyText();
  for (const want of ['fs-observe/fs', 'deadline_ms', '3000', 'fs.read:workspace']) {
    assert.ok(text.includes(want), `the extension page shows ${want}`);
  }
  assert.match(text, /[0-9a-f]{64}/, 'the component digest is shown');
  ok('extension page: components with digests and limits, grants, revisions');

  for (const [hash, want] of [['#/goals', 'A quiet second goal'], ['#/turns', 'Turn journal'],
    ['#/extensions', 'Extensions'], ['#/goals/g1/todos/gate1', 'loopx gate resolve']]) {
    await open(hash);
    assert.ok((await bodyText()).includes(want), `${hash} shows ${want}`);
  }
  ok('goals, turns, extensions and a gate permalink load');

  // Nothing the store holds became markup: no alert, no image or extra script, no error.
  const counts = await page.evaluate(() => ({
    img: document.querySelectorAll('img').length,
    script: document.querySelectorAll('script').length,
    svgInView: document.querySelectorAll('main svg:not(.plot)').length,
    bold: document.querySelectorAll('main b').length,
  }));
  assert.deepEqual(counts, { img: 0, script: 1, svgInView: 0, bold: 0 });
  assert.deepEqual(dialogs, [], 'no hostile text ran');
  assert.deepEqual(errors, [], 'no script error');
  assert.deepEqual(foreign, [], 'nothing fetched from anywhere but the server');
  ok('hostile titles, evidence and summaries rendered inert (no dialog, no element created)');

  // Live: a claim made from the CLI appears without a reload.
  await open('#/goals/g1');
  const navigations = [];
  page.on('framenavigated', f => navigations.push(f.url()));
  const row = 'tr[data-todo="t3"]';
  assert.ok(!(await page.locator(row).textContent()).includes('carol'));
  const started = Date.now();
  cli('todo', 'claim', '--goal-id', 'g1', '--todo-id', 't3', '--agent-id', 'carol');
  await page.waitForFunction(sel => document.querySelector(sel).textContent.includes('carol'), row,
    { timeout: 5000 });
  const shownAt = Number(await page.evaluate(() => document.documentElement.dataset.renderedAt));
  const latency = shownAt - started;
  console.log(`# change-to-browser latency: ${latency} ms (CLI claim start to the page showing it; limit ${LATENCY_LIMIT_MS} ms)`);
  assert.ok(latency < LATENCY_LIMIT_MS, `latency ${latency} ms`);
  assert.deepEqual(navigations, [], 'the page was not reloaded');
  ok(`a claim from the CLI shows live in ${latency} ms without a reload`);

  // A dropped connection: the server stops, a todo is added meanwhile, the server comes back on
  // the same port; the page reconnects by itself and shows the change, still without a reload.
  const listen = new URL(base).host;
  server.kill();
  await once(server, 'exit');
  await page.waitForSelector('#live.off', { timeout: 10000 });
  cli('todo', 'add', '--goal-id', 'g1', '--id', 't5', '--title', 'Added while the server was down');
  await startServer(listen);
  await page.waitForSelector('#live.on', { timeout: 20000 });
  await page.waitForSelector('tr[data-todo="t5"]', { timeout: 20000 });
  assert.deepEqual(navigations, [], 'the page was not reloaded');
  ok('after the server restarts, the page reconnects by itself and shows what changed meanwhile');
}

try {
  mkdirSync(screenshots, { recursive: true });
  await main();
  console.log(`# ${checks.length} checks passed`);
} catch (e) {
  console.error('not ok -', e && e.stack || e);
  process.exitCode = 1;
} finally {
  if (context) await context.close().catch(() => {});
  if (server) server.kill();
  rmSync(project, { recursive: true, force: true });
  rmSync(profile, { recursive: true, force: true });
}
