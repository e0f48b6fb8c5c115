//! Retention on SQLite: the operator's policy (in `store_meta`), the rows `loopx gc` compacts (settled turn
//! journals, old run payloads), the time-bounded reads of the goal projections' live window and
//! monthly archive, and `VACUUM`. Kept apart from the turn and run modules, whose queries are on
//! every turn's hot path; these run when an operator asks, or read through `todos_by_finish`.

use serde::{Deserialize, Serialize};

use super::*;
use crate::kernel::store::{CompactableTurn, RetentionPolicy, RetentionRead, RetentionTx};

use super::todos::LIVE_STATUSES;

/// A todo in a terminal status (`TodoStatus::is_terminal`), as SQL spelled exactly as the `WHERE`
/// of the partial index `todos_by_finish`, so that SQLite can use the index for it.
const TERMINAL: &str = "(status = 'completed' OR status = 'archived')";

/// The operator's policy as stored in `store_meta.retention_policy` (migration 16; NULL when none
/// was set). Its field names are the stored format, apart from [`RetentionPolicy`]'s.
#[derive(Serialize, Deserialize)]
struct RetentionPolicyState {
    live_window_days: i64,
    journal_full_days: i64,
    keep_journal_bodies: bool,
    report_files_days: i64,
    history_days: i64,
    updated_at: i64,
}

/// The most finished todos of one status the goal projections list (the rest are counted).
pub(crate) const LIVE_FINISHED_PER_STATUS: i64 = 100;

/// A goal's todos that finished in `[?2, ?3)`, oldest first, through `todos_by_finish`.
pub(super) fn finished_between_sql() -> String {
    format!(
        "SELECT {TODO_COLUMNS} FROM todos INDEXED BY todos_by_finish WHERE goal_id = ?1 AND {TERMINAL} \
         AND updated_at >= ?2 AND updated_at < ?3 ORDER BY updated_at, id"
    )
}

/// The newest todos of a terminal `status` written at or after `?3`, at most `?4`.
fn newest_finished(status: &str) -> String {
    format!(
        "SELECT view_key, view_json, view_md, id, view_format IS ?2 AND claim_agent IS NULL \
         FROM todos INDEXED BY todos_by_finish WHERE goal_id = ?1 AND status = '{status}' \
         AND updated_at >= ?3 ORDER BY updated_at DESC LIMIT ?4"
    )
}

/// The queries of [`Db::for_each_live_projected_todo`], run one after the other: the live todos
/// (`?1` goal, `?2` the line format) from their covering index, then the newest completed and the
/// newest archived ones written at or after `?3`, at most `?4` of each. Three plain statements
/// rather than one `UNION ALL`: SQLite planned the compound statement's arms against every index
/// of `todos`, and planned it again once its parameters were bound, which cost more than reading
/// a thousand rows (docs/benchmarks.md).
pub(super) fn live_projected_todos_sql() -> [String; 3] {
    [
        format!(
            "SELECT view_key, view_json, view_md, id, view_format IS ?2 AND claim_agent IS NULL \
             FROM todos INDEXED BY todos_live_views WHERE goal_id = ?1 AND status IN {LIVE_STATUSES}"
        ),
        newest_finished("completed"),
        newest_finished("archived"),
    ]
}

impl Db<'_> {
    fn retention_policy(&self) -> Result<Option<RetentionPolicy>> {
        let stored: Option<RetentionPolicyState> = self.query_one(
            "SELECT retention_policy FROM store_meta WHERE id = 1",
            [],
            |r| match r.get_ref(0)? {
                ValueRef::Null => Ok(None),
                _ => json_col(r, 0).map(Some),
            },
            "reading the retention policy",
        )?;
        Ok(stored.map(|s| RetentionPolicy {
            live_window_days: s.live_window_days,
            journal_full_days: s.journal_full_days,
            keep_journal_bodies: s.keep_journal_bodies,
            report_files_days: s.report_files_days,
            history_days: s.history_days,
        }))
    }

    fn set_retention_policy(&self, p: &RetentionPolicy, now: i64) -> Result<()> {
        let state = to_json(&RetentionPolicyState {
            live_window_days: p.live_window_days,
            journal_full_days: p.journal_full_days,
            keep_journal_bodies: p.keep_journal_bodies,
            report_files_days: p.report_files_days,
            history_days: p.history_days,
            updated_at: now,
        });
        self.conn
            .prepare_cached("UPDATE store_meta SET retention_policy = ?1 WHERE id = 1")
            .and_then(|mut s| s.execute([state]))
            .map_err(self.err("writing the retention policy"))?;
        Ok(())
    }

    fn compactable_turns(&self, before: i64, limit: usize) -> Result<Vec<CompactableTurn>> {
        self.query_all(
            "SELECT turn_key, goal_id, length(CAST(data AS BLOB)) FROM turns \
             WHERE status <> 'in_progress' AND compacted_at IS NULL AND updated_at < ?1 \
             ORDER BY updated_at, turn_key LIMIT ?2",
            params![before, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| {
                Ok(CompactableTurn {
                    turn_key: r.get(0)?,
                    goal_id: r.get(1)?,
                    data_bytes: r.get(2)?,
                })
            },
            "listing turns to compact",
        )
    }

    fn compact_turn(&self, turn_key: &str, data: &serde_json::Value, at: i64) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE turns SET data = ?2, compacted_at = ?3 WHERE turn_key = ?1 \
                 AND status <> 'in_progress' AND compacted_at IS NULL",
            )
            .and_then(|mut s| s.execute(params![turn_key, to_json(data), at]))
            .map_err(self.err("compacting a turn's journal"))?;
        Ok(changed == 1)
    }

    fn visit_runs_created_between(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(&Run) -> Result<()>,
    ) -> Result<()> {
        const WHAT: &str = "listing runs by time";
        self.scan_without_mmap(
            &format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND created_at >= ?2 \
                 AND created_at < ?3 ORDER BY created_at, id"
            ),
            params![goal_id, from, to],
            WHAT,
            &mut |row| visit(&run_from_row(row).map_err(self.err(WHAT))?),
        )
    }

    /// Steps through the rows of `sql`, a scan of a month of history, with the memory map off:
    /// every page a scan touches through the map stays resident in this process (a month of a
    /// long project is hundreds of megabytes), where SQLite's page cache holds a bounded number.
    fn scan_without_mmap(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        what: &'static str,
        each: &mut dyn FnMut(&rusqlite::Row<'_>) -> Result<()>,
    ) -> Result<()> {
        let set = |bytes: u64| {
            self.conn
                .execute_batch(&format!("PRAGMA mmap_size={bytes}"))
                .map_err(self.err("setting the memory map size"))
        };
        set(0)?;
        let scan = || -> Result<()> {
            let mut stmt = self.conn.prepare_cached(sql).map_err(self.err(what))?;
            let mut rows = stmt.query(params).map_err(self.err(what))?;
            while let Some(row) = rows.next().map_err(self.err(what))? {
                each(row)?;
            }
            Ok(())
        };
        let result = scan();
        set(super::connection::MMAP_BYTES)?;
        result
    }

    fn runs_with_payload_before(
        &self,
        goal_id: &str,
        before: i64,
        limit: usize,
    ) -> Result<Vec<(String, i64)>> {
        self.query_all(
            "SELECT id, length(CAST(payload AS BLOB)) FROM runs WHERE goal_id = ?1 \
             AND created_at < ?2 AND payload_dropped_at IS NULL ORDER BY created_at, id LIMIT ?3",
            params![goal_id, before, i64::try_from(limit).unwrap_or(i64::MAX)],
            |r| Ok((r.get(0)?, r.get(1)?)),
            "listing old run payloads",
        )
    }

    fn drop_run_payload(
        &self,
        goal_id: &str,
        run_id: &str,
        payload: &serde_json::Value,
        at: i64,
    ) -> Result<bool> {
        let changed = self
            .conn
            .prepare_cached(
                "UPDATE runs SET payload = ?3, payload_dropped_at = ?4 WHERE goal_id = ?1 \
                 AND id = ?2 AND payload_dropped_at IS NULL",
            )
            .and_then(|mut s| s.execute(params![goal_id, run_id, to_json(payload), at]))
            .map_err(self.err("dropping a run's payload"))?;
        Ok(changed == 1)
    }

    fn oldest_run_at(&self, goal_id: &str) -> Result<Option<i64>> {
        self.query_one(
            "SELECT MIN(created_at) FROM runs WHERE goal_id = ?1",
            [goal_id],
            |r| r.get(0),
            "finding the oldest run",
        )
    }

    fn visit_todos_finished_between(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(&Todo) -> Result<()>,
    ) -> Result<()> {
        // Dependencies per todo, not the goal's whole map (`visit_todos`): a month is a slice of
        // the history, the map all of it.
        const WHAT: &str = "listing finished todos";
        self.scan_without_mmap(
            &finished_between_sql(),
            params![goal_id, from, to],
            WHAT,
            &mut |row| {
                let mut todo = todo_from_row(row).map_err(self.err(WHAT))?;
                todo.depends_on = self.deps_of(goal_id, &todo.id)?;
                visit(&todo)
            },
        )
    }

    fn oldest_finished_todo_at(&self, goal_id: &str) -> Result<Option<i64>> {
        // One `MIN` per status, each the first entry of its range of `todos_by_finish`: the
        // projections ask on every refresh until there is a month to archive.
        self.query_one(
            "SELECT MIN(m) FROM (\
             SELECT MIN(updated_at) AS m FROM todos WHERE goal_id = ?1 AND status = 'completed' \
             UNION ALL \
             SELECT MIN(updated_at) FROM todos WHERE goal_id = ?1 AND status = 'archived')",
            [goal_id],
            |r| r.get(0),
            "finding the oldest finished todo",
        )
    }

    /// The live-window variant of `for_each_projected_todo`: live todos, one range per status of
    /// the covering partial index `todos_live_views` (their cached lines are in it, so no row is
    /// looked up by key), then the terminal ones written at or after `finished_since`, at most
    /// [`LIVE_FINISHED_PER_STATUS`] of each status, newest first, each one range of
    /// `todos_by_finish` walked from its end: a goal that finishes thousands of todos a day
    /// renders the same few hundred lines. Without `INDEXED BY` SQLite (no statistics) walked
    /// every todo of the goal by primary key for the live part.
    pub(super) fn for_each_live_projected_todo(
        &self,
        goal_id: &str,
        format: i64,
        finished_since: i64,
        visit: &mut dyn FnMut(ProjectedTodo<'_>) -> Result<()>,
    ) -> Result<()> {
        let mut uncached: Vec<String> = Vec::new();
        for (i, sql) in live_projected_todos_sql().iter().enumerate() {
            let mut stmt = self
                .conn
                .prepare_cached(sql)
                .map_err(self.err("listing live projected todos"))?;
            let mut rows = if i == 0 {
                stmt.query(params![goal_id, format])
            } else {
                stmt.query(params![
                    goal_id,
                    format,
                    finished_since,
                    LIVE_FINISHED_PER_STATUS
                ])
            }
            .map_err(self.err("listing live projected todos"))?;
            while let Some(row) = rows
                .next()
                .map_err(self.err("listing live projected todos"))?
            {
                match super::projection_cache::cached_lines(row)
                    .map_err(self.err("listing live projected todos"))?
                {
                    Some(lines) => visit(ProjectedTodo::Cached(lines))?,
                    None => uncached.push(
                        row.get(3)
                            .map_err(self.err("listing live projected todos"))?,
                    ),
                }
            }
        }
        if uncached.is_empty() {
            return Ok(());
        }
        self.visit_todos(
            " AND id IN (SELECT value FROM json_each(?2))",
            params![goal_id, to_json(&uncached)],
            super::todos::DepsLookup::PerTodo,
            &mut |todo, order| visit(ProjectedTodo::Uncached(todo, order)),
        )
    }
}

impl<M: Mode> RetentionRead for SqliteTx<'_, M> {
    fn retention_policy(&self) -> Result<Option<RetentionPolicy>> {
        self.db().retention_policy()
    }
    fn compactable_turns(&self, before: i64, limit: usize) -> Result<Vec<CompactableTurn>> {
        self.db().compactable_turns(before, limit)
    }
    fn visit_runs_created_between(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(&Run) -> Result<()>,
    ) -> Result<()> {
        self.db()
            .visit_runs_created_between(goal_id, from, to, visit)
    }
    fn runs_with_payload_before(
        &self,
        goal_id: &str,
        before: i64,
        limit: usize,
    ) -> Result<Vec<(String, i64)>> {
        self.db().runs_with_payload_before(goal_id, before, limit)
    }
    fn oldest_run_at(&self, goal_id: &str) -> Result<Option<i64>> {
        self.db().oldest_run_at(goal_id)
    }
    fn visit_todos_finished_between(
        &self,
        goal_id: &str,
        from: i64,
        to: i64,
        visit: &mut dyn FnMut(&Todo) -> Result<()>,
    ) -> Result<()> {
        self.db()
            .visit_todos_finished_between(goal_id, from, to, visit)
    }
    fn oldest_finished_todo_at(&self, goal_id: &str) -> Result<Option<i64>> {
        self.db().oldest_finished_todo_at(goal_id)
    }
}

impl RetentionTx for SqliteTx<'_, Write> {
    fn set_retention_policy(&self, policy: &RetentionPolicy, now: i64) -> Result<()> {
        self.db().set_retention_policy(policy, now)
    }
    fn compact_turn(&self, turn_key: &str, data: &serde_json::Value, at: i64) -> Result<bool> {
        self.db().compact_turn(turn_key, data, at)
    }
    fn drop_run_payload(
        &self,
        goal_id: &str,
        run_id: &str,
        payload: &serde_json::Value,
        at: i64,
    ) -> Result<bool> {
        self.db().drop_run_payload(goal_id, run_id, payload, at)
    }
}

impl SqliteStore {
    /// `VACUUM` rebuilds the file without its free pages; the truncating checkpoint then moves
    /// the rebuilt pages out of the WAL and gives the WAL's blocks back, which the per-commit
    /// restart (`SqliteTx::restart_wal`) deliberately keeps: after a vacuum they are the size of
    /// the whole database.
    pub(super) fn vacuum(&mut self) -> Result<(u64, u64)> {
        refuse_if_damaged(&self.path)?;
        let before = self.file_bytes();
        let db = Db::new(&self.conn, &self.path);
        self.conn
            .execute_batch("VACUUM")
            .map_err(db.err("vacuuming the database"))?;
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(db.err("checkpointing after the vacuum"))?;
        Ok((before, self.file_bytes()))
    }

    /// The database file and its WAL, in bytes (a missing WAL counts 0).
    fn file_bytes(&self) -> u64 {
        [self.path.clone(), wal_path(&self.path)]
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }

    pub(super) fn storage_bytes(&self) -> Result<(u64, u64)> {
        let db = Db::new(&self.conn, &self.path);
        let (free, page): (i64, i64) = self
            .conn
            .query_row(
                "SELECT freelist_count, page_size FROM pragma_freelist_count, pragma_page_size",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(db.err("measuring the database"))?;
        Ok((self.file_bytes(), (free.max(0) * page.max(0)) as u64))
    }
}
