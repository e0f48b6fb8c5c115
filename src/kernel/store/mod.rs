//! The store seam: the only path to durable state.
//!
//! The kernel decides; the store persists. Every kernel command runs inside exactly one store
//! transaction (`begin_write` takes the write lock up front, like SQLite's `BEGIN IMMEDIATE`), so a
//! command either happens completely or not at all. Reads and writes are different types: a read
//! snapshot is a [`StoreRead`], which has no write method, so "reads are pure" is checked by the
//! compiler. A backend is chosen by [`Backend`] and opened by [`open`]/[`create`]; nothing outside
//! this module names one, so a second backend is an addition rather than a rewrite. It fills
//! [`Store`], [`StoreRead`] and [`StoreTx`]; the projection cache ([`ProjectionCache`]) is an
//! optional speed-up it may leave out. `conformance` holds the properties every backend keeps.

#[cfg(test)]
mod conformance;
mod migrations;
mod sqlite;

use std::path::Path;

pub(crate) use sqlite::sync_directory;
pub use sqlite::{damage_marker, mark_damaged};

use crate::error::Result;
use crate::model::{
    ArtifactRecord, Deferral, Evidence, ExtensionRecord, Goal, GoalStatus, LedgerEntry, Monitor,
    QuotaPolicy, Reward, Role, Run, Todo, TodoStatus, TurnRecord,
};

/// One entry of the operation log: every committed kernel mutation appends exactly one, in the
/// same transaction as the change it describes, so the log can never disagree with the state.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct OpRecord {
    pub id: String,
    pub goal_id: Option<String>,
    pub actor: String,
    pub kind: String,
    pub detail: serde_json::Value,
    pub created_at: i64,
}

/// The operator's retention policy as stored (`loopx gc policy`; docs/operator-guide.md,
/// "Retention"). Every span is whole days; the kernel checks their ranges and supplies the
/// defaults when no row exists.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Finished todos and settled runs younger than this are shown in `state.json`/`STATE.md`.
    pub live_window_days: i64,
    /// A settled turn keeps its full journal this long before `gc` compacts it to its summary.
    pub journal_full_days: i64,
    /// Never compact journals (keep request/response bodies for good).
    pub keep_journal_bodies: bool,
    /// A run's report files stay one pair per run this long, then `gc` packs them per month.
    pub report_files_days: i64,
    /// Runs keep their full payload this long; `gc` drops older payloads (the row stays).
    pub history_days: i64,
}

impl RetentionPolicy {
    /// The policy when the operator has set none: a week of finished work in the goal
    /// projections, full turn journals and one report file per run for 30 days, run payloads for
    /// a year.
    pub const DEFAULT: RetentionPolicy = RetentionPolicy {
        live_window_days: 7,
        journal_full_days: 30,
        keep_journal_bodies: false,
        report_files_days: 30,
        history_days: 365,
    };
}

/// A settled turn's size as `gc` plans its compaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactableTurn {
    pub turn_key: String,
    pub goal_id: String,
    pub data_bytes: i64,
}

/// The store's commit counter, as of a snapshot: every write transaction that changes a row
/// raises it, one that appends at most one operation to the log by exactly one (a backend may
/// count the log's rows instead of writing a counter of its own). Commits are serialized, so a
/// snapshot at `n` followed by a commit at `n.next()` saw every commit but that one; a projection
/// stamped with the `seq` it was rendered at is current as long as the counter has not moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitSeq(pub u64);

impl CommitSeq {
    /// The counter after one more commit.
    pub fn next(self) -> CommitSeq {
        CommitSeq(self.0 + 1)
    }
}

/// Where a todo stands in the listing order of [`StoreRead::todos`] (priority, then creation).
/// Sorting by it puts todos visited by [`StoreRead::for_each_todo`] in that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TodoOrder {
    priority_rank: i64,
    seq: i64,
}

impl TodoOrder {
    pub(crate) fn new(priority_rank: i64, seq: i64) -> TodoOrder {
        TodoOrder { priority_rank, seq }
    }
}

/// A todo's rendered projection lines with what orders and counts it: the shape lines are cached
/// in ([`ProjectionCacheTx::cache_projected_todo`]) and served back in ([`ProjectedTodo::Cached`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TodoLines<'a> {
    pub order: TodoOrder,
    pub role: Role,
    pub status: TodoStatus,
    pub json: &'a str,
    pub md: &'a str,
}

/// A todo as [`ProjectionCache::for_each_projected_todo`] yields it.
pub enum ProjectedTodo<'a> {
    /// Lines cached by [`ProjectionCacheTx::cache_projected_todo`] in the requested format, still the
    /// todo's own (it has not been written since).
    Cached(TodoLines<'a>),
    /// No valid cached lines, or lines that depend on the time (a claimed todo): the todo itself.
    Uncached(&'a Todo, TodoOrder),
}

/// Which backend holds a project's state. Only SQLite today; the variant is the one place a
/// second backend is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Sqlite,
}

/// Creates the database of a new project at `db` with `backend` (and runs its migrations).
pub fn create(backend: Backend, db: &Path) -> Result<Box<dyn Store>> {
    match backend {
        Backend::Sqlite => Ok(Box::new(sqlite::SqliteStore::create(db)?)),
    }
}

/// Whether opening a store may bring its schema up to date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SchemaUpgrade {
    /// Apply the migrations a schema older than this build's needs (what every command does).
    Apply,
    /// Write nothing: a schema older than this build's is refused (`Conflict`). For processes
    /// that only ever read, the dashboard's server above all.
    Refuse,
}

/// Opens the existing database of a project at `db` with `backend`, bringing its schema up to
/// date. Never creates one.
pub fn open(backend: Backend, db: &Path) -> Result<Box<dyn Store>> {
    open_with(backend, db, SchemaUpgrade::Apply)
}

/// Opens the existing database of a project at `db` with `backend`; `upgrade` says whether an
/// older schema is migrated or refused. Never creates one.
pub fn open_with(backend: Backend, db: &Path, upgrade: SchemaUpgrade) -> Result<Box<dyn Store>> {
    match backend {
        Backend::Sqlite => Ok(Box::new(sqlite::SqliteStore::open(db, upgrade)?)),
    }
}

/// A backend that can open read snapshots and serialized write transactions. `Send`, so a
/// kernel that owns one can move to another thread (a server holds one per thread).
pub trait Store: Send {
    /// A consistent read snapshot. Never writes, never takes the write lock. Taken through
    /// `&self`: a snapshot opened while another is open on the same handle reads inside it.
    fn begin_read(&self) -> Result<Box<dyn StoreRead + '_>>;
    /// A write transaction holding the store's write lock from the start. Refused, like
    /// [`Store::refuse_if_damaged`], once the store is known to be damaged.
    fn begin_write(&mut self) -> Result<Box<dyn StoreTx + '_>>;
    /// `Err(Corrupt)` once the store has been found damaged and not yet checked healthy (SQLite:
    /// the `.loopx/CORRUPT` marker). Whatever writes derived state without a write transaction
    /// (re-creating every projection) asks first, so a damaged store never overwrites good files.
    fn refuse_if_damaged(&self) -> Result<()>;
    /// Full integrity check of the storage (slow; for `doctor`). Returns the problems found.
    fn integrity_check(&self) -> Result<Vec<String>>;
    /// The content problems a storage check cannot see (for `doctor`; reads every row): values
    /// that do not decode, stored JSON that does not parse, dangling references.
    fn content_problems(&self) -> Result<Vec<String>>;
    /// Schema version the store is at.
    fn schema_version(&self) -> Result<i64>;
    /// Writes a consistent copy of the whole store to `dest`, never replacing an existing file;
    /// returns the number of pages (or the backend's unit) copied.
    fn backup_to(&self, dest: &Path) -> Result<u64>;
    /// Rebuilds the storage to give the space of removed data back to the filesystem (SQLite's
    /// `VACUUM`, then a truncating checkpoint); outside any transaction. Returns the bytes of the
    /// database files before and after.
    fn vacuum(&mut self) -> Result<(u64, u64)>;
    /// Bytes the storage's files take now, and bytes free inside them (reclaimable by `vacuum`).
    fn storage_bytes(&self) -> Result<(u64, u64)>;
    /// A number that changes when another handle may have committed since it was last read on
    /// this one (a read leaves it alone; a checkpoint may move it): the change watcher's
    /// (`kernel::watch`) cheap first check after a file event. Read outside any transaction.
    fn data_version(&self) -> Result<i64>;
    /// The position of the newest operation-log row, which moves with every committed kernel
    /// mutation (each appends one row) and with nothing else: what the change watcher confirms a
    /// commit with. Read outside any transaction.
    fn op_log_position(&self) -> Result<i64>;
}

/// Queries inside one transaction, read snapshot or write. Has no method that writes.
pub trait StoreRead: MonitorRead + GoalProbeRead {
    /// The commit counter as of this snapshot (see [`CommitSeq`]).
    fn commit_seq(&self) -> Result<CommitSeq>;

    // Goals (layer 1 registry + layer 2 goal state).
    fn goal(&self, id: &str) -> Result<Option<Goal>>;
    fn goals(&self) -> Result<Vec<Goal>>;
    fn goal_ids_with_status(&self, status: GoalStatus) -> Result<Vec<String>>;

    // Todos, dependencies, claims.
    fn todo(&self, goal_id: &str, todo_id: &str) -> Result<Option<Todo>>;
    /// Every todo of a goal, by priority and then creation order.
    fn todos(&self, goal_id: &str) -> Result<Vec<Todo>>;
    /// Calls `visit` for every todo of a goal in storage order, with its place in the order of
    /// [`StoreRead::todos`], without collecting them: the `&Todo` is one buffer refilled per row, so
    /// `refresh-state` renders 1,000 todos per tick without copying each one first.
    fn for_each_todo(
        &self,
        goal_id: &str,
        visit: &mut dyn FnMut(&Todo, TodoOrder) -> Result<()>,
    ) -> Result<()>;
    fn todo_count(&self, goal_id: &str) -> Result<i64>;
    /// Agent todos that are claimable at `now` with every dependency terminal, best first
    /// (priority, then creation order). Gates are not considered here.
    /// A dependency is met only by a `completed` todo (an archived one, such as a rejected gate,
    /// keeps its dependents waiting).
    fn ready_todos(&self, goal_id: &str, now: i64, limit: usize) -> Result<Vec<Todo>>;
    /// The todo `agent_id` holds a live claim on, if any (best first).
    fn claimed_by(&self, goal_id: &str, agent_id: &str, now: i64) -> Result<Option<Todo>>;
    /// Open `user_gate`/`user_action` todos of a goal.
    fn open_user_todos(&self, goal_id: &str) -> Result<Vec<Todo>>;
    /// A goal's todos of `role` in one of `statuses`, in listing order, at most `limit`: bounded
    /// by the todos in those statuses, never by the goal's completed history.
    fn todos_in_status(
        &self,
        goal_id: &str,
        role: Role,
        statuses: &[TodoStatus],
        limit: usize,
    ) -> Result<Vec<Todo>>;
    /// Counts of a goal's todos per (role, status).
    fn todo_status_counts(&self, goal_id: &str) -> Result<Vec<(String, String, i64)>>;
    /// Capabilities named by non-terminal todos of a goal.
    fn bound_capabilities(&self, goal_id: &str) -> Result<Vec<String>>;

    // Evidence.
    fn evidence_for(&self, goal_id: &str, todo_id: &str) -> Result<Vec<Evidence>>;
    fn recent_evidence(&self, goal_id: &str, limit: usize) -> Result<Vec<Evidence>>;

    // Run log (layer 3) and history with reward overlays (layer 4).
    fn run(&self, goal_id: &str, run_id: &str) -> Result<Option<Run>>;
    /// Newest first, at most `limit`, strictly older than `before` when given.
    fn runs(&self, goal_id: &str, limit: usize, before: Option<&str>) -> Result<Vec<Run>>;
    /// The id of the goal's newest run, or of `agent_id`'s newest run in it.
    fn latest_run_id(&self, goal_id: &str, agent_id: Option<&str>) -> Result<Option<String>>;
    fn run_count(&self, goal_id: &str) -> Result<i64>;
    fn rewards_for_runs(&self, goal_id: &str, run_ids: &[String]) -> Result<Vec<Reward>>;
    fn recent_rewards(&self, goal_id: &str, limit: usize) -> Result<Vec<Reward>>;

    // Quota (layer 6).
    fn quota_policy(&self, goal_id: &str) -> Result<Option<QuotaPolicy>>;
    fn ledger_entry(&self, effect_id: &str) -> Result<Option<LedgerEntry>>;
    /// Net slots (spends minus voids) recorded at or after `since`, optionally for one agent.
    fn spent_since(&self, goal_id: &str, since: i64, agent_id: Option<&str>) -> Result<i64>;
    /// Oldest spend time at or after `since` (when the window frees its next slot).
    fn oldest_spend_since(&self, goal_id: &str, since: i64) -> Result<Option<i64>>;
    fn recent_ledger(&self, goal_id: &str, limit: usize) -> Result<Vec<LedgerEntry>>;
    /// Net slots (spends minus voids) of the goal's ledger rows dated in `[from, to)`, in
    /// `buckets` equal spans of that time, oldest first (`buckets` entries; empty when `to <=
    /// from` or `buckets` is 0). Reads only the rows inside `[from, to)`, never the ledger's
    /// older history, so its cost follows the window's rows, not the goal's age.
    fn spend_series(&self, goal_id: &str, from: i64, to: i64, buckets: usize) -> Result<Vec<i64>>;

    // Operation log.
    fn ops(&self, goal_id: Option<&str>, limit: usize) -> Result<Vec<OpRecord>>;

    // Extensions (layer 1 registry).
    fn extension(&self, id: &str) -> Result<Option<ExtensionRecord>>;
    fn extensions(&self) -> Result<Vec<ExtensionRecord>>;
    /// Every recorded revision of an extension, newest first.
    fn extension_revisions(&self, id: &str) -> Result<Vec<ExtensionRecord>>;
    /// The recorded artifact digest for a component compiled for an engine fingerprint.
    fn component_artifact(
        &self,
        component_sha256: &str,
        engine_key: &str,
    ) -> Result<Option<ArtifactRecord>>;
    /// Every recorded artifact digest (for `doctor`).
    fn component_artifacts(&self) -> Result<Vec<ArtifactRecord>>;

    // Turn journal.
    fn turn(&self, turn_key: &str) -> Result<Option<TurnRecord>>;
    fn unsettled_turns(&self, goal_id: Option<&str>) -> Result<Vec<TurnRecord>>;
    /// Quota slots held by the goal's unsettled turns that have not reached their spend phase:
    /// `(all agents, agent_id's)`. A turn reserves its slot in the transaction that starts it, so
    /// the quota check and the spend cannot interleave with another turn's.
    fn reserved_slots(&self, goal_id: &str, agent_id: Option<&str>) -> Result<(i64, i64)>;
    /// The unsettled turn working `todo_id`, if any: `(turn key, agent id)`.
    fn unsettled_turn_on(&self, goal_id: &str, todo_id: &str) -> Result<Option<(String, String)>>;
    /// The newest `limit` turns, optionally of one goal and one journal status, newest first.
    fn recent_turns(
        &self,
        goal_id: Option<&str>,
        status: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>>;

    /// The retention queries (`loopx gc`; the goal projections' live window and archive).
    fn retention(&self) -> &dyn RetentionRead;

    /// The backend's projection cache, if it keeps one (see [`for_each_projected_todo`]).
    fn projection_cache(&self) -> Option<&dyn ProjectionCache> {
        None
    }
}

/// Writes inside one write transaction, which also reads what it has written.
pub trait StoreTx: StoreRead + MonitorTx + GoalProbeTx {
    /// Commits, and returns the commit counter as of this transaction's end: one more than at
    /// its start when it changed a row, the same when it changed none.
    fn commit(self: Box<Self>) -> Result<CommitSeq>;

    // Goals (layer 1 registry + layer 2 goal state).
    fn insert_goal(&self, goal: &Goal) -> Result<()>;
    fn update_goal(&self, goal: &Goal) -> Result<()>;

    // Todos, dependencies, claims.
    fn insert_todo(&self, todo: &Todo) -> Result<()>;
    fn update_todo(&self, todo: &Todo) -> Result<()>;

    // Evidence.
    fn insert_evidence(&self, evidence: &Evidence) -> Result<i64>;

    // Run log (layer 3) and history with reward overlays (layer 4).
    /// The greatest run id stored, in any goal: a new run's id must sort after it
    /// ([`crate::kernel::run::RunIds`]).
    fn newest_run_id(&self) -> Result<Option<String>>;
    fn insert_run(&self, run: &Run) -> Result<()>;
    fn insert_reward(&self, reward: &Reward) -> Result<i64>;

    // Quota (layer 6).
    fn set_quota_policy(&self, goal_id: &str, policy: &QuotaPolicy) -> Result<()>;
    /// Inserts a ledger row; returns false (and writes nothing) when the effect id exists.
    fn insert_ledger(&self, entry: &LedgerEntry) -> Result<bool>;
    /// Tells the store that the goal's quota window now starts at `since`, so it can keep the
    /// window's count for the goal and for `agent_id` without reading rows that left it. A hint
    /// for speed: [`StoreRead::spent_since`] answers exactly for any `since` either way.
    fn move_quota_window(&self, goal_id: &str, agent_id: Option<&str>, since: i64) -> Result<()>;

    // Operation log.
    fn append_op(&self, op: &OpRecord) -> Result<()>;

    // Extensions (layer 1 registry).
    fn upsert_extension(&self, record: &ExtensionRecord) -> Result<()>;
    fn set_extension_active(&self, id: &str, revision: Option<i64>, enabled: bool) -> Result<()>;
    fn delete_extension(&self, id: &str) -> Result<()>;
    /// Records (or replaces) the digest of the artifact just compiled from a verified component.
    fn record_component_artifact(&self, record: &ArtifactRecord) -> Result<()>;

    // Turn journal.
    fn upsert_turn(&self, turn: &TurnRecord) -> Result<()>;

    /// The retention writes (`loopx gc`, `loopx gc policy`).
    fn retention_tx(&self) -> &dyn RetentionTx;

    /// The backend's projection cache, writable, if it keeps one.
    fn projection_cache_tx(&self) -> Option<&dyn ProjectionCacheTx> {
        None
    }
}

/// The queries retention needs (`loopx gc`, the goal projections' live window and monthly
/// archive), a part of every read transaction ([`StoreRead::retention`]).
pub trait RetentionRead {
    /// The stored retention policy; `None` when the operator never set one (defaults apply).
    fn retention_policy(&self) -> Result<Option<RetentionPolicy>>;
    /// Settled turns whose journal is not compacted and that settled before `before`, oldest
    /// first, at most `limit`.
    fn compactable_turns(&self, before: i64, limit: usize) -> Result<Vec<CompactableTurn>>;
    /// Visits the goal's runs created in `[from, to)`, oldest first, one at a time: a month of
    /// them, payloads included, need not fit in memory.
    fn visit_runs_created_between(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(&Run) -> Result<()>,
    ) -> Result<()>;
    /// `(run id, payload bytes)` of a goal's runs created before `before` whose payload `gc` has
    /// not dropped, oldest first, at most `limit`.
    fn runs_with_payload_before(
        &self,
        goal_id: &str,
        before: i64,
        limit: usize,
    ) -> Result<Vec<(String, i64)>>;
    /// The creation time of the goal's oldest run, if any.
    fn oldest_run_at(&self, goal_id: &str) -> Result<Option<i64>>;
    /// Visits the goal's terminal todos last written in `[from, to)`, oldest first, one at a
    /// time, dependencies included.
    fn visit_todos_finished_between(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(&Todo) -> Result<()>,
    ) -> Result<()>;
    /// When the goal's oldest terminal todo was last written, if any.
    fn oldest_finished_todo_at(&self, goal_id: &str) -> Result<Option<i64>>;
}

/// The writes of `loopx gc` and `loopx gc policy`, a part of every write transaction
/// ([`StoreTx::retention_tx`]).
pub trait RetentionTx: RetentionRead {
    fn set_retention_policy(&self, policy: &RetentionPolicy, now: i64) -> Result<()>;
    /// Replaces a settled, not yet compacted turn's journal data with `data` and marks it
    /// compacted at `at`; false (nothing written) for an unsettled or already compacted turn.
    fn compact_turn(&self, turn_key: &str, data: &serde_json::Value, at: i64) -> Result<bool>;
    /// Replaces a run's payload with `payload` and marks it dropped at `at`; false when the
    /// payload was already dropped or the run is unknown.
    fn drop_run_payload(
        &self,
        goal_id: &str,
        run_id: &str,
        payload: &serde_json::Value,
        at: i64,
    ) -> Result<bool>;
}

/// Each todo's rendered projection lines, cached beside the todo so `refresh-state` copies the
/// lines of unchanged todos instead of rendering every one. Optional: a backend without it
/// renders every todo (see [`for_each_projected_todo`]), which is slower, never different.
pub trait ProjectionCache {
    /// Like [`StoreRead::for_each_todo`], but a todo whose projection lines are cached in `format`
    /// comes as those lines instead of being read and decoded in full.
    fn for_each_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()>;
    /// Like [`ProjectionCache::for_each_projected_todo`], but only the goal's open todos and the
    /// terminal ones last written at or after `finished_since` (the projections' live window).
    fn for_each_live_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        finished_since: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()>;
}

/// The write half of [`ProjectionCache`], reachable only from a write transaction.
pub trait ProjectionCacheTx: ProjectionCache {
    /// Caches a todo's rendered projection lines; the next write of the todo clears them.
    fn cache_projected_todo(
        &self,
        goal_id: &str,
        todo_id: &str,
        format: i64,
        lines: &TodoLines<'_>,
    ) -> Result<()>;
}

/// Visits every todo of a goal like [`StoreRead::for_each_todo`], as the cached lines in
/// `format` where the backend keeps a [`ProjectionCache`] with valid ones. The projections read
/// through [`for_each_live_projected_todo`]; this whole-goal walk is what the cache's tests check.
#[cfg(test)]
pub fn for_each_projected_todo(
    tx: &dyn StoreRead,
    goal_id: &str,
    format: i64,
    visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
) -> Result<()> {
    match tx.projection_cache() {
        Some(cache) => cache.for_each_projected_todo(goal_id, format, visit),
        None => tx.for_each_todo(goal_id, &mut |todo, order| {
            visit(ProjectedTodo::Uncached(todo, order))
        }),
    }
}

/// Visits the goal's open todos and the terminal ones last written at or after
/// `finished_since`, like [`for_each_projected_todo`] (cached lines where the backend keeps them).
pub fn for_each_live_projected_todo(
    tx: &dyn StoreRead,
    goal_id: &str,
    format: i64,
    finished_since: i64,
    visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
) -> Result<()> {
    match tx.projection_cache() {
        Some(cache) => cache.for_each_live_projected_todo(goal_id, format, finished_since, visit),
        None => tx.for_each_todo(goal_id, &mut |todo, order| {
            if todo.status.is_terminal() && todo.updated_at < finished_since {
                return Ok(());
            }
            visit(ProjectedTodo::Uncached(todo, order))
        }),
    }
}

/// A monitor with the fields of its todo the schedule depends on, as
/// [`MonitorRead::visit_active_monitors`] yields it.
#[derive(Debug, Clone, PartialEq)]
pub struct ActiveMonitor {
    pub monitor: Monitor,
    pub todo_status: TodoStatus,
    pub todo_last_fence: i64,
    pub todo_updated_at: i64,
    /// The expiry of the todo's claim, live or not.
    pub claim_expires_at: Option<i64>,
}

impl ActiveMonitor {
    /// When the monitor is next due (see [`Monitor::due_at`]).
    pub fn due_at(&self) -> i64 {
        self.monitor
            .due_at(self.todo_last_fence, self.todo_updated_at)
    }
}

/// Monitor and deferral reads (tables `monitors`, `todo_deferrals`), part of every [`StoreRead`].
pub trait MonitorRead {
    fn monitor(&self, goal_id: &str, todo_id: &str) -> Result<Option<Monitor>>;
    /// Every monitor of a goal, whatever its todo's status, by todo id.
    fn monitors(&self, goal_id: &str) -> Result<Vec<Monitor>>;
    /// Calls `visit` for each monitor of the goal whose todo is not terminal, by stored
    /// `next_due_at`, earliest first, until `visit` returns `false`.
    fn visit_active_monitors(
        &self,
        goal_id: &str,
        visit: &mut dyn FnMut(&ActiveMonitor) -> Result<bool>,
    ) -> Result<()>;
    /// How many monitors of the goal have a todo that is not terminal.
    fn active_monitor_count(&self, goal_id: &str) -> Result<i64>;
    fn deferral(&self, goal_id: &str, todo_id: &str) -> Result<Option<Deferral>>;
    /// The goal's deferrals of todos still deferred, earliest first, at most `limit`.
    fn next_deferrals(&self, goal_id: &str, limit: usize) -> Result<Vec<Deferral>>;
    /// The earliest expiry after `now` of a live claim on the goal's todos.
    fn next_lease_expiry(&self, goal_id: &str, now: i64) -> Result<Option<i64>>;
}

/// Monitor and deferral writes, part of every [`StoreTx`].
pub trait MonitorTx: MonitorRead {
    fn upsert_monitor(&self, monitor: &Monitor) -> Result<()>;
    /// Sets (or with `None` removes) a todo's resume time.
    fn set_deferral(&self, goal_id: &str, todo_id: &str, until_at: Option<i64>) -> Result<()>;
}

/// The goal's provider probe (table `goal_probes`), part of every [`StoreRead`].
pub trait GoalProbeRead {
    fn goal_probe(&self, goal_id: &str) -> Result<Option<crate::model::GoalProbe>>;
}

/// Goal probe writes, part of every [`StoreTx`].
pub trait GoalProbeTx: GoalProbeRead {
    fn upsert_goal_probe(&self, probe: &crate::model::GoalProbe) -> Result<()>;
    fn delete_goal_probe(&self, goal_id: &str) -> Result<()>;
}
