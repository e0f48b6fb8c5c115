//! Monitors and deferred todos' resume times (tables `monitors` and `todo_deferrals`, migrations
//! 8 and 16): the SQLite side of [`MonitorRead`] and [`MonitorTx`].

use super::*;
use crate::kernel::store::{ActiveMonitor, MonitorRead, MonitorTx};
use serde::{Deserialize, Serialize};

use crate::model::{CheckResult, Deferral, Monitor, MonitorFollowUp, ProbeSpec};

/// A monitor's row: its key, the due time its queries select and order by, and `state`.
const MONITOR_COLUMNS: &str = "m.goal_id, m.todo_id, m.next_due_at, m.state";
const MONITOR_COLUMN_COUNT: usize = 4;

/// A monitor's `state` column (migration 16): every field but the key and `next_due_at`, as one
/// JSON object read and written whole. Its field names are the stored format, apart from the
/// model's, so renaming a field of [`Monitor`] cannot change what is on disk.
#[derive(Serialize, Deserialize)]
struct MonitorState {
    every_ms: i64,
    until_at: Option<i64>,
    target: Option<String>,
    follow_up: MonitorFollowUp,
    max_no_change: i64,
    probe: Option<ProbeSpec>,
    last_check_at: Option<i64>,
    last_digest: Option<String>,
    last_result: Option<CheckResult>,
    no_change_count: i64,
    material_change: bool,
    checks: i64,
    failures: i64,
    last_failure: Option<String>,
    check_seq: i64,
    checked_fence: i64,
    created_at: i64,
    updated_at: i64,
}

fn monitor_from_row(row: &Row) -> rusqlite::Result<Monitor> {
    let s: MonitorState = json_col(row, 3)?;
    Ok(Monitor {
        goal_id: row.get(0)?,
        todo_id: row.get(1)?,
        next_due_at: row.get(2)?,
        every_ms: s.every_ms,
        until_at: s.until_at,
        target: s.target,
        follow_up: s.follow_up,
        max_no_change: s.max_no_change,
        probe: s.probe,
        last_check_at: s.last_check_at,
        last_digest: s.last_digest,
        last_result: s.last_result,
        no_change_count: s.no_change_count,
        material_change: s.material_change,
        checks: s.checks,
        failures: s.failures,
        last_failure: s.last_failure,
        check_seq: s.check_seq,
        checked_fence: s.checked_fence,
        created_at: s.created_at,
        updated_at: s.updated_at,
    })
}

fn monitor_state(m: &Monitor) -> String {
    to_json(&MonitorState {
        every_ms: m.every_ms,
        until_at: m.until_at,
        target: m.target.clone(),
        follow_up: m.follow_up,
        max_no_change: m.max_no_change,
        probe: m.probe.clone(),
        last_check_at: m.last_check_at,
        last_digest: m.last_digest.clone(),
        last_result: m.last_result,
        no_change_count: m.no_change_count,
        material_change: m.material_change,
        checks: m.checks,
        failures: m.failures,
        last_failure: m.last_failure.clone(),
        check_seq: m.check_seq,
        checked_fence: m.checked_fence,
        created_at: m.created_at,
        updated_at: m.updated_at,
    })
}

fn deferral_from_row(row: &Row) -> rusqlite::Result<Deferral> {
    Ok(Deferral {
        goal_id: row.get(0)?,
        todo_id: row.get(1)?,
        until_at: row.get(2)?,
    })
}

impl<M: Mode> MonitorRead for SqliteTx<'_, M> {
    fn monitor(&self, goal_id: &str, todo_id: &str) -> Result<Option<Monitor>> {
        self.db.query_opt(
            &format!(
                "SELECT {MONITOR_COLUMNS} FROM monitors m WHERE m.goal_id = ?1 AND m.todo_id = ?2"
            ),
            params![goal_id, todo_id],
            monitor_from_row,
            "reading a monitor",
        )
    }

    fn monitors(&self, goal_id: &str) -> Result<Vec<Monitor>> {
        self.db.query_all(
            &format!(
                "SELECT {MONITOR_COLUMNS} FROM monitors m WHERE m.goal_id = ?1 ORDER BY m.todo_id"
            ),
            [goal_id],
            monitor_from_row,
            "listing monitors",
        )
    }

    fn visit_active_monitors(
        &self,
        goal_id: &str,
        visit: &mut dyn FnMut(&ActiveMonitor) -> Result<bool>,
    ) -> Result<()> {
        let context = "listing active monitors";
        let mut stmt = self
            .db
            .conn
            .prepare_cached(&format!(
                "SELECT {MONITOR_COLUMNS}, t.status, t.last_fence, t.updated_at, t.claim_expires_at \
                 FROM monitors m CROSS JOIN todos t ON t.goal_id = m.goal_id AND t.id = m.todo_id \
                 WHERE m.goal_id = ?1 AND t.status NOT IN ('completed', 'archived') \
                 ORDER BY m.next_due_at, m.todo_id"
            ))
            .map_err(self.db.err(context))?;
        let mut rows = stmt.query([goal_id]).map_err(self.db.err(context))?;
        while let Some(row) = rows.next().map_err(self.db.err(context))? {
            let n = MONITOR_COLUMN_COUNT;
            let active = monitor_from_row(row)
                .and_then(|monitor| {
                    Ok(ActiveMonitor {
                        monitor,
                        todo_status: text_enum(row, n, TodoStatus::parse)?,
                        todo_last_fence: row.get(n + 1)?,
                        todo_updated_at: row.get(n + 2)?,
                        claim_expires_at: row.get(n + 3)?,
                    })
                })
                .map_err(self.db.err(context))?;
            if !visit(&active)? {
                break;
            }
        }
        Ok(())
    }

    fn active_monitor_count(&self, goal_id: &str) -> Result<i64> {
        self.db.query_one(
            "SELECT COUNT(*) FROM monitors m CROSS JOIN todos t ON t.goal_id = m.goal_id AND t.id = m.todo_id \
             WHERE m.goal_id = ?1 AND t.status NOT IN ('completed', 'archived')",
            [goal_id],
            |r| r.get(0),
            "counting monitors",
        )
    }

    fn deferral(&self, goal_id: &str, todo_id: &str) -> Result<Option<Deferral>> {
        self.db.query_opt(
            "SELECT goal_id, todo_id, until_at FROM todo_deferrals WHERE goal_id = ?1 AND todo_id = ?2",
            params![goal_id, todo_id],
            deferral_from_row,
            "reading a deferral",
        )
    }

    fn next_deferrals(&self, goal_id: &str, limit: usize) -> Result<Vec<Deferral>> {
        self.db.query_all(
            &format!(
                "SELECT d.goal_id, d.todo_id, d.until_at FROM todo_deferrals d \
                 CROSS JOIN todos t ON t.goal_id = d.goal_id AND t.id = d.todo_id \
                 WHERE d.goal_id = ?1 AND t.status = 'deferred' ORDER BY d.until_at, d.todo_id LIMIT {limit}"
            ),
            [goal_id],
            deferral_from_row,
            "listing deferrals",
        )
    }

    fn next_lease_expiry(&self, goal_id: &str, now: i64) -> Result<Option<i64>> {
        self.db.query_one(
            NEXT_LEASE_EXPIRY,
            params![goal_id, now],
            |r| r.get(0),
            "reading the next lease expiry",
        )
    }
}

impl MonitorTx for SqliteTx<'_, Write> {
    fn upsert_monitor(&self, m: &Monitor) -> Result<()> {
        self.db
            .conn
            .prepare_cached(
                "INSERT INTO monitors (goal_id, todo_id, next_due_at, state) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT (goal_id, todo_id) DO UPDATE SET next_due_at = ?3, state = ?4",
            )
            .and_then(|mut s| {
                s.execute(params![m.goal_id, m.todo_id, m.next_due_at, monitor_state(m)])
            })
            .map_err(self.db.err("writing a monitor"))?;
        Ok(())
    }

    fn set_deferral(&self, goal_id: &str, todo_id: &str, until_at: Option<i64>) -> Result<()> {
        let result = match until_at {
            Some(at) => self
                .db
                .conn
                .prepare_cached(
                    "INSERT INTO todo_deferrals (goal_id, todo_id, until_at) VALUES (?1, ?2, ?3) \
                     ON CONFLICT (goal_id, todo_id) DO UPDATE SET until_at = ?3",
                )
                .and_then(|mut s| s.execute(params![goal_id, todo_id, at])),
            None => self
                .db
                .conn
                .prepare_cached("DELETE FROM todo_deferrals WHERE goal_id = ?1 AND todo_id = ?2")
                .and_then(|mut s| s.execute(params![goal_id, todo_id])),
        };
        result.map_err(self.db.err("writing a deferral"))?;
        Ok(())
    }
}

/// The earliest lease expiry after `?2` of the goal's claimed todos: one probe of
/// `todos_by_expiry` (migration 9), whatever the goal's history.
pub(super) const NEXT_LEASE_EXPIRY: &str = "SELECT MIN(claim_expires_at) FROM todos \
     WHERE goal_id = ?1 AND status = 'claimed' AND claim_expires_at > ?2";
