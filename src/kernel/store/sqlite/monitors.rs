//! Monitors and deferred todos' resume times (tables `monitors` and `todo_deferrals`, migration
//! 8): the SQLite side of [`MonitorRead`] and [`MonitorTx`].

use super::*;
use crate::kernel::store::{ActiveMonitor, MonitorRead, MonitorTx};
use crate::model::{CheckResult, Deferral, Monitor, MonitorFollowUp};

const MONITOR_COLUMNS: &str = "m.goal_id, m.todo_id, m.every_ms, m.until_at, m.target, m.follow_up, \
     m.max_no_change, m.probe, m.next_due_at, m.last_check_at, m.last_digest, m.last_result, \
     m.no_change_count, m.material_change, m.checks, m.failures, m.last_failure, m.check_seq, \
     m.checked_fence, m.created_at, m.updated_at";
const MONITOR_COLUMN_COUNT: usize = 21;

fn monitor_from_row(row: &Row) -> rusqlite::Result<Monitor> {
    let probe: Option<String> = row.get(7)?;
    let probe = match probe {
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| bad_text(7, e))?),
        None => None,
    };
    let last_result: Option<String> = row.get(11)?;
    let last_result = match last_result {
        Some(text) => Some(CheckResult::parse(&text).map_err(|e| bad_text(11, e))?),
        None => None,
    };
    Ok(Monitor {
        goal_id: row.get(0)?,
        todo_id: row.get(1)?,
        every_ms: row.get(2)?,
        until_at: row.get(3)?,
        target: row.get(4)?,
        follow_up: text_enum(row, 5, MonitorFollowUp::parse)?,
        max_no_change: row.get(6)?,
        probe,
        next_due_at: row.get(8)?,
        last_check_at: row.get(9)?,
        last_digest: row.get(10)?,
        last_result,
        no_change_count: row.get(12)?,
        material_change: row.get::<_, i64>(13)? != 0,
        checks: row.get(14)?,
        failures: row.get(15)?,
        last_failure: row.get(16)?,
        check_seq: row.get(17)?,
        checked_fence: row.get(18)?,
        created_at: row.get(19)?,
        updated_at: row.get(20)?,
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
        let probe = m.probe.as_ref().map(to_json);
        self.db
            .conn
            .prepare_cached(
                "INSERT INTO monitors (goal_id, todo_id, every_ms, until_at, target, follow_up, max_no_change, \
                 probe, next_due_at, last_check_at, last_digest, last_result, no_change_count, material_change, \
                 checks, failures, last_failure, check_seq, checked_fence, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21) \
                 ON CONFLICT (goal_id, todo_id) DO UPDATE SET every_ms = ?3, until_at = ?4, target = ?5, \
                 follow_up = ?6, max_no_change = ?7, probe = ?8, next_due_at = ?9, last_check_at = ?10, \
                 last_digest = ?11, last_result = ?12, no_change_count = ?13, material_change = ?14, \
                 checks = ?15, failures = ?16, last_failure = ?17, check_seq = ?18, checked_fence = ?19, \
                 created_at = ?20, updated_at = ?21",
            )
            .and_then(|mut s| {
                s.execute(params![
                    m.goal_id,
                    m.todo_id,
                    m.every_ms,
                    m.until_at,
                    m.target,
                    m.follow_up.as_str(),
                    m.max_no_change,
                    probe,
                    m.next_due_at,
                    m.last_check_at,
                    m.last_digest,
                    m.last_result.map(CheckResult::as_str),
                    m.no_change_count,
                    m.material_change as i64,
                    m.checks,
                    m.failures,
                    m.last_failure,
                    m.check_seq,
                    m.checked_fence,
                    m.created_at,
                    m.updated_at,
                ])
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
