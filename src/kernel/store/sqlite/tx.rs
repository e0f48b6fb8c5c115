//! Transactions on the connection: a read snapshot and a write transaction are different types
//! over the same queries ([`Db`]), so only a write transaction has the write methods. Also the
//! small query helpers every module uses, so each query states its SQL, its parameters, its row
//! decoder and what it was doing, and nothing else.

use std::marker::PhantomData;

use super::*;

/// The connection and the database's path, for the queries of every table module.
#[derive(Clone, Copy)]
pub(super) struct Db<'a> {
    pub(super) conn: &'a Connection,
    pub(super) path: &'a Path,
}

impl<'a> Db<'a> {
    pub(super) fn new(conn: &'a Connection, path: &'a Path) -> Db<'a> {
        Db { conn, path }
    }

    /// The error mapping for one call site. The context is static, so mapping costs nothing
    /// until an error happens: row loops call this once per row.
    pub(super) fn err(
        &self,
        context: &'static str,
    ) -> impl FnOnce(rusqlite::Error) -> LoopxError + '_ {
        move |e| map_err_errno(self.path, context, e, system_errno(self.conn))
    }

    /// Every row `sql` returns, decoded by `map`; `what` names the query in an error.
    pub(super) fn query_all<T>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        map: impl FnMut(&Row<'_>) -> rusqlite::Result<T>,
        what: &'static str,
    ) -> Result<Vec<T>> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_map(params, map)?.collect())
            .map_err(self.err(what))
    }

    /// The first row `sql` returns, decoded by `map`, or `None` when it returns none.
    pub(super) fn query_opt<T>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
        what: &'static str,
    ) -> Result<Option<T>> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_row(params, map).optional())
            .map_err(self.err(what))
    }

    /// The one row `sql` returns (an aggregate), decoded by `map`.
    pub(super) fn query_one<T>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        map: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
        what: &'static str,
    ) -> Result<T> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut stmt| stmt.query_row(params, map))
            .map_err(self.err(what))
    }
}

impl Db<'_> {
    /// The commits that appended no operation plus the operation log's newest rowid: every
    /// commit that changes a row raises one of the two (the log's rows are never deleted, so its
    /// rowids only grow), and one that appends a single operation or none raises the sum by one.
    pub(super) fn commit_seq(&self) -> Result<CommitSeq> {
        self.query_one(
            "SELECT commit_seq + coalesce((SELECT max(rowid) FROM ops), 0) FROM store_meta WHERE id = 1",
            [],
            |r| r.get(0).map(CommitSeq),
            "reading the commit counter",
        )
    }
}

/// The mode of a [`SqliteTx`]: [`Read`] or [`Write`].
pub(super) trait Mode {
    const BEGIN: &'static str;
    const CONTEXT: &'static str;
}

/// A read snapshot (`BEGIN DEFERRED`): implements only [`StoreRead`].
pub(super) struct Read;

/// A write transaction (`BEGIN IMMEDIATE`, the write lock from the start): also [`StoreTx`].
pub(super) struct Write;

impl Mode for Read {
    const BEGIN: &'static str = "BEGIN DEFERRED";
    const CONTEXT: &'static str = "starting a read";
}

impl Mode for Write {
    const BEGIN: &'static str = "BEGIN IMMEDIATE";
    const CONTEXT: &'static str = "taking the write lock";
}

/// One transaction on the connection. Ends with `commit`, or rolls back when dropped.
pub(super) struct SqliteTx<'a, M: Mode> {
    pub(super) db: Db<'a>,
    /// Whether there is nothing left to roll back: committed, or a read that joined a
    /// transaction already open on the connection (whose owner ends it).
    finished: bool,
    /// The connection's count of changed rows when the transaction began: a commit raises the
    /// commit counter only when it moved.
    changes_at_begin: u64,
    /// Whether this transaction appended to the operation log, which then counts the commit.
    appended_op: std::cell::Cell<bool>,
    mode: PhantomData<M>,
}

impl<'a, M: Mode> SqliteTx<'a, M> {
    /// The queries of this transaction, for the table modules that implement a trait on it.
    pub(super) fn db(&self) -> Db<'a> {
        self.db
    }

    pub(super) fn begin(conn: &'a Connection, path: &'a Path) -> Result<SqliteTx<'a, M>> {
        let db = Db::new(conn, path);
        // A read taken while a transaction is open on this connection (a read inside a read,
        // through a shared handle) sees that transaction's snapshot instead of failing to nest.
        // A write never gets here with one open: it needs the store exclusively.
        let joined = !conn.is_autocommit();
        if !joined {
            conn.execute_batch(M::BEGIN)
                .map_err(|e| map_err_errno(path, M::CONTEXT, e, system_errno(conn)))?;
        }
        Ok(SqliteTx {
            db,
            finished: joined,
            changes_at_begin: conn.total_changes(),
            appended_op: std::cell::Cell::new(false),
            mode: PhantomData,
        })
    }
}

impl<M: Mode> Drop for SqliteTx<'_, M> {
    fn drop(&mut self) {
        if !self.finished {
            // Rolling back a failed or abandoned transaction; an error here leaves SQLite to roll
            // back when the connection closes, which it does anyway.
            let _ = self.db.conn.execute_batch("ROLLBACK");
        }
    }
}

impl SqliteTx<'_, Write> {
    /// Copies the WAL into the database and starts it over from its first frame, keeping the
    /// file's blocks. Truncating it instead (SQLite's `TRUNCATE` checkpoint) gave the blocks
    /// back: the `ftruncate` was slow on a disk mounted with `discard`, and every commit after it
    /// appended to a growing file, whose fsync must also write the file's new size and block map
    /// and costs more than overwriting written blocks (docs/benchmarks.md).
    ///
    /// A `RESTART` checkpoint records that every frame was copied only in this process's WAL
    /// index. The next process rebuilds the index from the file, would count the old frames as
    /// live and append after them; so this process writes once more, rewriting `user_version`
    /// with its own value. That commit's frame goes to the start of the WAL under a new salt,
    /// which ends the old frames for every later reader.
    fn restart_wal(&self) -> rusqlite::Result<()> {
        let (busy, frames, copied): (i64, i64, i64) =
            self.db
                .conn
                .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?;
        if busy != 0 || frames != copied {
            return Ok(()); // a reader held on to the WAL; the next writer tries again
        }
        self.db.conn.execute_batch("BEGIN IMMEDIATE")?;
        let written = self
            .db
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
            .and_then(|version| {
                self.db
                    .conn
                    .execute_batch(&format!("PRAGMA user_version = {version}; COMMIT"))
            });
        if written.is_err() {
            let _ = self.db.conn.execute_batch("ROLLBACK");
        }
        written
    }
}

impl<M: Mode> StoreRead for SqliteTx<'_, M> {
    fn commit_seq(&self) -> Result<CommitSeq> {
        self.db.commit_seq()
    }

    fn goal(&self, id: &str) -> Result<Option<Goal>> {
        self.db.goal(id)
    }

    fn goals(&self) -> Result<Vec<Goal>> {
        self.db.goals()
    }

    fn goal_ids_with_status(&self, status: GoalStatus) -> Result<Vec<String>> {
        self.db.goal_ids_with_status(status)
    }

    fn todo(&self, goal_id: &str, todo_id: &str) -> Result<Option<Todo>> {
        self.db.todo(goal_id, todo_id)
    }

    fn todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        self.db.todos(goal_id)
    }

    fn for_each_todo(
        &self,
        goal_id: &str,
        visit: &mut dyn FnMut(&Todo, TodoOrder) -> Result<()>,
    ) -> Result<()> {
        self.db.for_each_todo(goal_id, visit)
    }

    fn todo_count(&self, goal_id: &str) -> Result<i64> {
        self.db.todo_count(goal_id)
    }

    fn ready_todos(&self, goal_id: &str, now: i64, limit: usize) -> Result<Vec<Todo>> {
        self.db.ready_todos(goal_id, now, limit)
    }

    fn claimed_by(&self, goal_id: &str, agent_id: &str, now: i64) -> Result<Option<Todo>> {
        self.db.claimed_by(goal_id, agent_id, now)
    }

    fn open_user_todos(&self, goal_id: &str) -> Result<Vec<Todo>> {
        self.db.open_user_todos(goal_id)
    }

    fn todos_in_status(
        &self,
        goal_id: &str,
        role: Role,
        statuses: &[TodoStatus],
        limit: usize,
    ) -> Result<Vec<Todo>> {
        self.db.todos_in_status(goal_id, role, statuses, limit)
    }

    fn todo_status_counts(&self, goal_id: &str) -> Result<Vec<(String, String, i64)>> {
        self.db.todo_status_counts(goal_id)
    }

    fn bound_capabilities(&self, goal_id: &str) -> Result<Vec<String>> {
        self.db.bound_capabilities(goal_id)
    }

    fn evidence_for(&self, goal_id: &str, todo_id: &str) -> Result<Vec<Evidence>> {
        self.db.evidence_for(goal_id, todo_id)
    }

    fn recent_evidence(&self, goal_id: &str, limit: usize) -> Result<Vec<Evidence>> {
        self.db.recent_evidence(goal_id, limit)
    }

    fn run(&self, goal_id: &str, run_id: &str) -> Result<Option<Run>> {
        self.db.run(goal_id, run_id)
    }

    fn runs(&self, goal_id: &str, limit: usize, before: Option<&str>) -> Result<Vec<Run>> {
        self.db.runs(goal_id, limit, before)
    }

    fn latest_run_id(&self, goal_id: &str, agent_id: Option<&str>) -> Result<Option<String>> {
        self.db.latest_run_id(goal_id, agent_id)
    }

    fn run_count(&self, goal_id: &str) -> Result<i64> {
        self.db.run_count(goal_id)
    }

    fn rewards_for_runs(&self, goal_id: &str, run_ids: &[String]) -> Result<Vec<Reward>> {
        self.db.rewards_for_runs(goal_id, run_ids)
    }

    fn recent_rewards(&self, goal_id: &str, limit: usize) -> Result<Vec<Reward>> {
        self.db.recent_rewards(goal_id, limit)
    }

    fn quota_policy(&self, goal_id: &str) -> Result<Option<QuotaPolicy>> {
        self.db.quota_policy(goal_id)
    }

    fn ledger_entry(&self, effect_id: &str) -> Result<Option<LedgerEntry>> {
        self.db.ledger_entry(effect_id)
    }

    fn spent_since(&self, goal_id: &str, since: i64, agent_id: Option<&str>) -> Result<i64> {
        self.db.spent_since(goal_id, since, agent_id)
    }

    fn oldest_spend_since(&self, goal_id: &str, since: i64) -> Result<Option<i64>> {
        self.db.oldest_spend_since(goal_id, since)
    }

    fn recent_ledger(&self, goal_id: &str, limit: usize) -> Result<Vec<LedgerEntry>> {
        self.db.recent_ledger(goal_id, limit)
    }

    fn spend_series(&self, goal_id: &str, from: i64, to: i64, buckets: usize) -> Result<Vec<i64>> {
        self.db.spend_series(goal_id, from, to, buckets)
    }

    fn ops(&self, goal_id: Option<&str>, limit: usize) -> Result<Vec<OpRecord>> {
        self.db.ops(goal_id, limit)
    }

    fn extension(&self, id: &str) -> Result<Option<ExtensionRecord>> {
        self.db.extension(id)
    }

    fn extensions(&self) -> Result<Vec<ExtensionRecord>> {
        self.db.extensions()
    }

    fn extension_revisions(&self, id: &str) -> Result<Vec<ExtensionRecord>> {
        self.db.extension_revisions(id)
    }

    fn component_artifact(
        &self,
        component_sha256: &str,
        engine_key: &str,
    ) -> Result<Option<ArtifactRecord>> {
        self.db.component_artifact(component_sha256, engine_key)
    }

    fn component_artifacts(&self) -> Result<Vec<ArtifactRecord>> {
        self.db.component_artifacts()
    }

    fn turn(&self, turn_key: &str) -> Result<Option<TurnRecord>> {
        self.db.turn(turn_key)
    }

    fn unsettled_turns(&self, goal_id: Option<&str>) -> Result<Vec<TurnRecord>> {
        self.db.unsettled_turns(goal_id)
    }

    fn reserved_slots(&self, goal_id: &str, agent_id: Option<&str>) -> Result<(i64, i64)> {
        self.db.reserved_slots(goal_id, agent_id)
    }

    fn unsettled_turn_on(&self, goal_id: &str, todo_id: &str) -> Result<Option<(String, String)>> {
        self.db.unsettled_turn_on(goal_id, todo_id)
    }

    fn recent_turns(
        &self,
        goal_id: Option<&str>,
        status: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>> {
        self.db.recent_turns(goal_id, status, limit)
    }

    fn projection_cache(&self) -> Option<&dyn ProjectionCache> {
        Some(self)
    }

    fn retention(&self) -> &dyn crate::kernel::store::RetentionRead {
        self
    }
}

impl StoreTx for SqliteTx<'_, Write> {
    fn commit(mut self: Box<Self>) -> Result<CommitSeq> {
        let Db { conn, path } = self.db;
        // A commit that appended to the operation log is counted by the log's new row; only one
        // that changed rows without it writes the counter's own row.
        if conn.total_changes() != self.changes_at_begin && !self.appended_op.get() {
            self.db.query_one(
                "UPDATE store_meta SET commit_seq = commit_seq + 1 WHERE id = 1 RETURNING 0",
                [],
                |r| r.get::<_, i64>(0),
                "counting the commit",
            )?;
        }
        let seq = self.db.commit_seq()?;
        conn.execute_batch("COMMIT")
            .map_err(|e| map_err_errno(path, "committing", e, system_errno(conn)))?;
        self.finished = true;
        if WAL_FRAMES.take() > WAL_CHECKPOINT_FRAMES {
            // The commit is already durable; a failed checkpoint only means the next writer
            // tries again.
            let _ = self.restart_wal();
        }
        Ok(seq)
    }

    fn insert_goal(&self, goal: &Goal) -> Result<()> {
        self.db.insert_goal(goal)
    }

    fn update_goal(&self, goal: &Goal) -> Result<()> {
        self.db.update_goal(goal)
    }

    fn insert_todo(&self, todo: &Todo) -> Result<()> {
        self.db.insert_todo(todo)
    }

    fn update_todo(&self, todo: &Todo) -> Result<()> {
        self.db.update_todo(todo)
    }

    fn insert_evidence(&self, e: &Evidence) -> Result<i64> {
        self.db.insert_evidence(e)
    }

    fn newest_run_id(&self) -> Result<Option<String>> {
        self.db.newest_run_id()
    }

    fn insert_run(&self, run: &Run) -> Result<()> {
        self.db.insert_run(run)
    }

    fn insert_reward(&self, r: &Reward) -> Result<i64> {
        self.db.insert_reward(r)
    }

    fn set_quota_policy(&self, goal_id: &str, p: &QuotaPolicy) -> Result<()> {
        self.db.set_quota_policy(goal_id, p)
    }

    fn insert_ledger(&self, e: &LedgerEntry) -> Result<bool> {
        self.db.insert_ledger(e)
    }

    fn move_quota_window(&self, goal_id: &str, agent_id: Option<&str>, since: i64) -> Result<()> {
        self.db.move_quota_window(goal_id, agent_id, since)
    }

    fn append_op(&self, op: &OpRecord) -> Result<()> {
        self.db.append_op(op)?;
        self.appended_op.set(true);
        Ok(())
    }

    fn upsert_extension(&self, rec: &ExtensionRecord) -> Result<()> {
        self.db.upsert_extension(rec)
    }

    fn set_extension_active(&self, id: &str, revision: Option<i64>, enabled: bool) -> Result<()> {
        self.db.set_extension_active(id, revision, enabled)
    }

    fn delete_extension(&self, id: &str) -> Result<()> {
        self.db.delete_extension(id)
    }

    fn record_component_artifact(&self, rec: &ArtifactRecord) -> Result<()> {
        self.db.record_component_artifact(rec)
    }

    fn upsert_turn(&self, t: &TurnRecord) -> Result<()> {
        self.db.upsert_turn(t)
    }

    fn projection_cache_tx(&self) -> Option<&dyn ProjectionCacheTx> {
        Some(self)
    }

    fn retention_tx(&self) -> &dyn crate::kernel::store::RetentionTx {
        self
    }
}

impl<M: Mode> ProjectionCache for SqliteTx<'_, M> {
    fn for_each_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()> {
        self.db.for_each_projected_todo(goal_id, format, visit)
    }

    fn for_each_live_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        finished_since: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()> {
        self.db
            .for_each_live_projected_todo(goal_id, format, finished_since, visit)
    }
}

impl ProjectionCacheTx for SqliteTx<'_, Write> {
    fn cache_projected_todo(
        &self,
        goal_id: &str,
        todo_id: &str,
        format: i64,
        lines: &TodoLines<'_>,
    ) -> Result<()> {
        self.db
            .cache_projected_todo(goal_id, todo_id, format, lines)
    }
}
