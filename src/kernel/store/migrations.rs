//! Numbered schema migrations. Each runs once, in order, inside the transaction that records it in
//! `schema_migrations`; a database newer than this binary is refused rather than guessed at.

/// (version, SQL). Append only: never edit a migration that has shipped.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (1, V1),
    (2, V2),
    (3, V3),
    (4, V4),
    (5, V5),
    (6, V6),
    (7, V7),
    (8, V8),
    (9, V9),
    (10, V10),
    (11, V11),
    (12, V12),
    (13, V13),
    (14, V14),
    (15, V15),
    (16, V16),
];

const V1: &str = r#"
CREATE TABLE goals (
    id TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    objective TEXT NOT NULL,
    success_criteria TEXT NOT NULL DEFAULT '[]',
    status TEXT NOT NULL,
    project_dir TEXT,
    next_probe TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE TABLE todos (
    goal_id TEXT NOT NULL REFERENCES goals(id),
    id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    role TEXT NOT NULL,
    kind TEXT NOT NULL,
    title TEXT NOT NULL,
    detail TEXT NOT NULL,
    priority INTEGER NOT NULL,
    status TEXT NOT NULL,
    capability TEXT,
    lane TEXT,
    gate_scope TEXT,
    claim_agent TEXT,
    claim_fence INTEGER,
    claim_expires_at INTEGER,
    claim_key TEXT,
    claimed_at INTEGER,
    last_fence INTEGER NOT NULL DEFAULT 0,
    status_reason TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (goal_id, id)
) WITHOUT ROWID;
CREATE INDEX todos_by_status ON todos(goal_id, status, priority, seq);
CREATE INDEX todos_by_claim ON todos(goal_id, claim_agent);

CREATE TABLE todo_deps (
    goal_id TEXT NOT NULL,
    todo_id TEXT NOT NULL,
    depends_on TEXT NOT NULL,
    PRIMARY KEY (goal_id, todo_id, depends_on)
) WITHOUT ROWID;

CREATE TABLE evidence (
    id INTEGER PRIMARY KEY,
    goal_id TEXT NOT NULL,
    todo_id TEXT NOT NULL,
    text TEXT NOT NULL,
    artifact_path TEXT,
    artifact_digest TEXT,
    run_id TEXT,
    actor TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX evidence_by_todo ON evidence(goal_id, todo_id, id);

CREATE TABLE runs (
    id TEXT PRIMARY KEY,
    goal_id TEXT NOT NULL,
    agent_id TEXT,
    todo_id TEXT,
    classification TEXT NOT NULL,
    outcome TEXT,
    summary TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX runs_by_goal ON runs(goal_id, id);
CREATE INDEX runs_by_agent ON runs(goal_id, agent_id, id);

CREATE TABLE rewards (
    id INTEGER PRIMARY KEY,
    goal_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    score REAL NOT NULL,
    comment TEXT NOT NULL,
    actor TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX rewards_by_run ON rewards(goal_id, run_id);

CREATE TABLE quota_policy (
    goal_id TEXT PRIMARY KEY,
    compute REAL NOT NULL,
    window_hours REAL NOT NULL,
    slot_minutes REAL NOT NULL,
    allowed_slots INTEGER,
    per_agent_cap INTEGER
);

CREATE TABLE quota_ledger (
    effect_id TEXT PRIMARY KEY,
    goal_id TEXT NOT NULL,
    agent_id TEXT,
    run_id TEXT,
    slots INTEGER NOT NULL,
    kind TEXT NOT NULL,
    voids_effect_id TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX ledger_by_time ON quota_ledger(goal_id, created_at);

CREATE TABLE ops (
    id TEXT PRIMARY KEY,
    goal_id TEXT,
    actor TEXT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX ops_by_goal ON ops(goal_id, id);

CREATE TABLE extensions (
    id TEXT PRIMARY KEY,
    active_revision INTEGER NOT NULL,
    enabled INTEGER NOT NULL
);
CREATE TABLE extension_revisions (
    id TEXT NOT NULL,
    revision INTEGER NOT NULL,
    version TEXT NOT NULL,
    manifest TEXT NOT NULL,
    grants TEXT NOT NULL,
    install_dir TEXT NOT NULL,
    component_hashes TEXT NOT NULL,
    installed_at INTEGER NOT NULL,
    PRIMARY KEY (id, revision)
);

CREATE TABLE turns (
    turn_key TEXT PRIMARY KEY,
    goal_id TEXT NOT NULL,
    agent_id TEXT NOT NULL,
    todo_id TEXT,
    status TEXT NOT NULL,
    phases TEXT NOT NULL,
    data TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE INDEX turns_unsettled ON turns(status, goal_id);
"#;

/// Indexes shaped for the tick's reads at thousands of todos, so none of them scans or sorts the
/// goal's todos: the ready queue and the open gates (`role`, `status`, then priority order), the
/// per-role status counts (a covering walk of the same index), an agent's live claim, the
/// capabilities bound by todos, and a goal's latest evidence. No partial indexes: matching a query against an index's `WHERE`
/// makes SQLite re-prepare statements once their parameters are bound, which costs more per
/// process than the index saves.
const V2: &str = r#"
DROP INDEX todos_by_status;
DROP INDEX todos_by_claim;
CREATE INDEX todos_by_role_status ON todos(goal_id, role, status, priority, seq);
CREATE INDEX todos_by_claim ON todos(goal_id, claim_agent, status, priority, seq);
CREATE INDEX todos_by_capability ON todos(goal_id, capability);
CREATE INDEX evidence_by_goal ON evidence(goal_id, id);
"#;

/// Each todo's rendered `state.json` and STATE.md lines, cached by `refresh-state` with the format
/// they were rendered in. Every write of a todo clears them (`SqliteTx::write_todo`), so a cached
/// line is always the current todo's; lines that depend on the time (a claim's liveness) are never
/// cached.
const V3: &str = r#"
ALTER TABLE todos ADD COLUMN view_format INTEGER;
ALTER TABLE todos ADD COLUMN view_json TEXT;
ALTER TABLE todos ADD COLUMN view_md TEXT;
"#;

/// A cached todo's listing order, role and status packed in one integer beside its lines
/// (`SqliteTx::cache_projected_todo`), so `refresh-state` reads one column per cached todo instead
/// of two enum texts and two integers. Cleared with the lines on every write of the todo.
const V4: &str = r#"
ALTER TABLE todos ADD COLUMN view_key INTEGER;
"#;

/// The digest of every precompiled component artifact, keyed by the component it was compiled from
/// and the engine fingerprint it was compiled for. Deserializing an artifact runs native code, so an
/// artifact is only loaded when its bytes hash to the digest recorded here, by the install (or the
/// recompile from a verified component) that produced it; a file planted in or swapped into the
/// cache has no matching row (docs/plugin-host.md, "Precompiled artifacts").
const V5: &str = r#"
CREATE TABLE component_artifacts (
    component_sha256 TEXT NOT NULL,
    engine_key TEXT NOT NULL,
    artifact_sha256 TEXT NOT NULL,
    recorded_at INTEGER NOT NULL,
    PRIMARY KEY (component_sha256, engine_key)
);
"#;

/// The quota window's spend count kept as an aggregate, so checking it reads one row instead of
/// every ledger row in the window. One row per goal (`agent_key` '') and per agent that spent in
/// it: `live_slots` is the net of the key's ledger rows dated at or after `since`. A new ledger row
/// is added in the transaction that writes it (when dated at or after `since`); a spend moves the
/// goal's and its agent's `since` up to the current window's start, taking off the rows that left
/// the window since the last spend; a read asking for another start adds or takes off the rows
/// between the two, found by the indexes below, so its cost is bounded by the rows that entered or
/// left the window since the last spend, never by the ledger's length. Rows older than every
/// `since` are never read again. Existing ledgers start at their oldest row, exact at once; the
/// first spend moves them.
///
/// Beside it, each goal's todo count per (role, status), kept by triggers on `todos` (any writer,
/// a future prune included, keeps it right), so the tick's and `status`'s counts read a few rows
/// instead of walking every todo the goal ever had.
const V6: &str = r#"
CREATE TABLE quota_window (
    goal_id TEXT NOT NULL,
    agent_key TEXT NOT NULL,
    live_slots INTEGER NOT NULL,
    since INTEGER NOT NULL,
    PRIMARY KEY (goal_id, agent_key)
) WITHOUT ROWID;
INSERT INTO quota_window (goal_id, agent_key, live_slots, since)
    SELECT goal_id, '', SUM(slots), MIN(created_at) FROM quota_ledger GROUP BY goal_id;
INSERT INTO quota_window (goal_id, agent_key, live_slots, since)
    SELECT goal_id, agent_id, SUM(slots), MIN(created_at) FROM quota_ledger
    WHERE agent_id IS NOT NULL GROUP BY goal_id, agent_id;
DROP INDEX ledger_by_time;
CREATE INDEX ledger_by_time ON quota_ledger(goal_id, created_at, kind, slots);
CREATE INDEX ledger_by_agent_time ON quota_ledger(goal_id, agent_id, created_at, slots);

CREATE TABLE todo_counts (
    goal_id TEXT NOT NULL,
    role TEXT NOT NULL,
    status TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (goal_id, role, status)
) WITHOUT ROWID;
INSERT INTO todo_counts (goal_id, role, status, n)
    SELECT goal_id, role, status, COUNT(*) FROM todos GROUP BY goal_id, role, status;
CREATE TRIGGER todo_counts_insert AFTER INSERT ON todos BEGIN
    INSERT INTO todo_counts (goal_id, role, status, n) VALUES (NEW.goal_id, NEW.role, NEW.status, 1)
        ON CONFLICT (goal_id, role, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER todo_counts_update AFTER UPDATE OF goal_id, role, status ON todos
WHEN OLD.goal_id IS NOT NEW.goal_id OR OLD.role IS NOT NEW.role OR OLD.status IS NOT NEW.status BEGIN
    UPDATE todo_counts SET n = n - 1
        WHERE goal_id = OLD.goal_id AND role = OLD.role AND status = OLD.status;
    INSERT INTO todo_counts (goal_id, role, status, n) VALUES (NEW.goal_id, NEW.role, NEW.status, 1)
        ON CONFLICT (goal_id, role, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER todo_counts_delete AFTER DELETE ON todos BEGIN
    UPDATE todo_counts SET n = n - 1
        WHERE goal_id = OLD.goal_id AND role = OLD.role AND status = OLD.status;
END;
"#;

/// Retention (docs/operator-guide.md, "Retention"): the operator's policy, one row (none means the
/// defaults); the time a settled turn's journal was compacted to its summary and a run's payload
/// dropped by `loopx gc`; and the index that lets the goal projections read open and recently
/// finished todos, and `gc` a month of runs, without walking every row the goal ever had.
const V7: &str = r#"
CREATE TABLE retention_policy (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    live_window_days INTEGER NOT NULL,
    journal_full_days INTEGER NOT NULL,
    keep_journal_bodies INTEGER NOT NULL,
    report_files_days INTEGER NOT NULL,
    history_days INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);
ALTER TABLE turns ADD COLUMN compacted_at INTEGER;
ALTER TABLE runs ADD COLUMN payload_dropped_at INTEGER;
CREATE INDEX todos_by_finish ON todos(goal_id, status, updated_at);
CREATE INDEX runs_by_time ON runs(goal_id, created_at);
"#;

/// Scheduled monitors and deferred todos' resume times, in tables of their own keyed by goal and
/// todo id (not columns of `todos`, whose hot paths stay as they are). `monitors_by_due` serves
/// the decision's "earliest due monitor" and the heartbeat's sweep without a scan; a deferral row
/// lives while its todo is deferred (docs/state-model.md, "Monitors").
const V8: &str = r#"
CREATE TABLE monitors (
    goal_id TEXT NOT NULL,
    todo_id TEXT NOT NULL,
    every_ms INTEGER NOT NULL,
    until_at INTEGER,
    target TEXT,
    follow_up TEXT NOT NULL,
    max_no_change INTEGER NOT NULL,
    probe TEXT,
    next_due_at INTEGER NOT NULL,
    last_check_at INTEGER,
    last_digest TEXT,
    last_result TEXT,
    no_change_count INTEGER NOT NULL DEFAULT 0,
    material_change INTEGER NOT NULL DEFAULT 0,
    checks INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    last_failure TEXT,
    check_seq INTEGER NOT NULL DEFAULT 0,
    checked_fence INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (goal_id, todo_id)
) WITHOUT ROWID;
CREATE INDEX monitors_by_due ON monitors(goal_id, next_due_at);

CREATE TABLE todo_deferrals (
    goal_id TEXT NOT NULL,
    todo_id TEXT NOT NULL,
    until_at INTEGER NOT NULL,
    PRIMARY KEY (goal_id, todo_id)
) WITHOUT ROWID;
CREATE INDEX deferrals_by_time ON todo_deferrals(goal_id, until_at);
"#;

/// The next lease to expire (the decision's wake-up hint) as one index probe: without it SQLite
/// walks every todo of the goal by primary key to find the few claimed ones, which on a goal with
/// a hundred thousand finished todos is most of the database's pages on every `should-run`.
const V9: &str = r#"
CREATE INDEX todos_by_expiry ON todos(goal_id, status, claim_expires_at);
"#;

/// A goal's provider probe, the executable form of its `next_probe` note: one row per goal, the
/// probe's spec, its revision and the claim of its runs, and the last outcome (docs/state-model.md,
/// "Goal probes").
const V10: &str = r#"
CREATE TABLE goal_probes (
    goal_id TEXT PRIMARY KEY,
    provider TEXT NOT NULL,
    operation TEXT NOT NULL,
    target TEXT NOT NULL,
    revision INTEGER NOT NULL,
    ran_revision INTEGER NOT NULL DEFAULT 0,
    run_seq INTEGER NOT NULL DEFAULT 0,
    runs INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    last_result TEXT,
    last_digest TEXT,
    last_checked_at INTEGER,
    last_failure TEXT,
    last_observation TEXT,
    changed_at INTEGER,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
"#;

/// A new todo's `seq` (one more than the goal's largest) as one index probe: without it every
/// `todo add` and every turn's follow-up walks all the goal's todos, finished ones included.
const V11: &str = r#"
CREATE INDEX todos_by_seq ON todos(goal_id, seq);
"#;

/// The goal projections' live todos with their cached lines, in an index that holds only live
/// todos (a partial index: the history is not in it) and every column the projection reads, so
/// rendering a goal steps through one index instead of looking up each live todo's row by key
/// (docs/benchmarks.md). The `WHERE` is `LIVE_STATUSES` spelled the same way, which is what
/// lets SQLite use the index for the projection's query.
const V12: &str = r#"
CREATE INDEX todos_live_views ON todos(goal_id, status, view_key, id, view_format, claim_agent, view_json, view_md)
    WHERE status IN ('open', 'claimed', 'blocked', 'deferred');
"#;

/// The store's commit counter: one row, its `seq` raised by every write transaction that changes
/// a row ([`super::StoreTx::commit`]). A projection records the `seq` it was rendered at, so a
/// later command can tell that nothing but its own commit happened since (docs/state-model.md,
/// "Commit sequence").
const V13: &str = r#"
CREATE TABLE commits (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL);
INSERT INTO commits (id, seq) VALUES (1, 0);
"#;

/// `todo_counts` is kept by the store's one writer of todos (`Db::write_todo`) instead of
/// triggers: every process parsed the three triggers with the schema, and every statement that
/// writes a todo compiled them in, which cost more than the counting (docs/decisions.md).
const V14: &str = r#"
DROP TRIGGER todo_counts_insert;
DROP TRIGGER todo_counts_update;
DROP TRIGGER todo_counts_delete;
"#;

/// The todo indexes that serve only some statuses hold only those rows (partial indexes): a write
/// that moves a todo between statuses outside an index's rows leaves its pages alone, so a claim
/// writes fewer pages to the WAL (docs/benchmarks.md). Each `WHERE` is spelled as the queries
/// that use the index spell their terms, which is what lets SQLite prove the index holds every
/// row they ask for: `status = 'completed'` implies one arm of the OR. `todos_by_claim` goes: an
/// agent's claim is found among the goal's claimed todos in `todos_by_expiry`, which holds only
/// those, and SQLite chose that index already.
const V15: &str = r#"
DROP INDEX todos_by_finish;
CREATE INDEX todos_by_finish ON todos(goal_id, status, updated_at)
    WHERE status = 'completed' OR status = 'archived';
DROP INDEX todos_by_expiry;
CREATE INDEX todos_by_expiry ON todos(goal_id, status, claim_expires_at) WHERE status = 'claimed';
DROP INDEX todos_by_claim;
DROP INDEX todos_by_capability;
CREATE INDEX todos_by_capability ON todos(goal_id, capability) WHERE capability IS NOT NULL;
"#;

/// Fewer schema objects and columns. Every process parses the whole schema before its first
/// statement, at a cost per column and per table, so the parse grows with each table a feature
/// adds (docs/benchmarks.md). A monitor's and a
/// goal probe's fields other than the keys their queries use move into one JSON object each
/// (`state`, read and written whole by the store), and the commit counter and the retention
/// policy share one row (`store_meta`). The small tables are rebuilt; nothing else is touched.
/// Stored JSON that does not parse stops the migration, which then leaves the database as it was.
const V16: &str = r#"
CREATE TABLE monitors_v16 (
    goal_id TEXT NOT NULL,
    todo_id TEXT NOT NULL,
    next_due_at INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (goal_id, todo_id)
) WITHOUT ROWID;
INSERT INTO monitors_v16 (goal_id, todo_id, next_due_at, state)
SELECT goal_id, todo_id, next_due_at, json_object(
    'every_ms', every_ms, 'until_at', until_at, 'target', target, 'follow_up', follow_up,
    'max_no_change', max_no_change, 'probe', json(probe), 'last_check_at', last_check_at,
    'last_digest', last_digest, 'last_result', last_result, 'no_change_count', no_change_count,
    'material_change', json(CASE WHEN material_change <> 0 THEN 'true' ELSE 'false' END),
    'checks', checks, 'failures', failures, 'last_failure', last_failure,
    'check_seq', check_seq, 'checked_fence', checked_fence,
    'created_at', created_at, 'updated_at', updated_at)
FROM monitors;
DROP TABLE monitors;
ALTER TABLE monitors_v16 RENAME TO monitors;
CREATE INDEX monitors_by_due ON monitors(goal_id, next_due_at);

CREATE TABLE goal_probes_v16 (
    goal_id TEXT PRIMARY KEY,
    state TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO goal_probes_v16 (goal_id, state)
SELECT goal_id, json_object(
    'provider', provider, 'operation', operation, 'target', target, 'revision', revision,
    'ran_revision', ran_revision, 'run_seq', run_seq, 'runs', runs, 'failures', failures,
    'last_result', last_result, 'last_digest', last_digest, 'last_checked_at', last_checked_at,
    'last_failure', last_failure, 'last_observation', last_observation,
    'changed_at', changed_at, 'created_at', created_at, 'updated_at', updated_at)
FROM goal_probes;
DROP TABLE goal_probes;
ALTER TABLE goal_probes_v16 RENAME TO goal_probes;

CREATE TABLE store_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    commit_seq INTEGER NOT NULL,
    retention_policy TEXT
);
INSERT INTO store_meta (id, commit_seq, retention_policy) VALUES (
    1,
    COALESCE((SELECT seq FROM commits WHERE id = 1), 0),
    (SELECT json_object(
        'live_window_days', live_window_days, 'journal_full_days', journal_full_days,
        'keep_journal_bodies', json(CASE WHEN keep_journal_bodies <> 0 THEN 'true' ELSE 'false' END),
        'report_files_days', report_files_days,
        'history_days', history_days, 'updated_at', updated_at)
     FROM retention_policy WHERE id = 1)
);
DROP TABLE commits;
DROP TABLE retention_policy;
"#;
