//! Quota policy and the spend/void ledger, keyed by effect id so a retried spend counts once.

use super::*;

impl Db<'_> {
    pub(super) fn quota_policy(&self, goal_id: &str) -> Result<Option<QuotaPolicy>> {
        self.query_opt(
            "SELECT compute, window_hours, slot_minutes, allowed_slots, per_agent_cap FROM quota_policy WHERE goal_id = ?1",
            [goal_id],
            |r| {
                Ok(QuotaPolicy {
                    compute: r.get(0)?,
                    window_hours: r.get(1)?,
                    slot_minutes: r.get(2)?,
                    allowed_slots: r.get(3)?,
                    per_agent_cap: r.get(4)?,
                })
            },
            "reading quota policy",
        )
    }

    pub(super) fn set_quota_policy(&self, goal_id: &str, p: &QuotaPolicy) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO quota_policy (goal_id, compute, window_hours, slot_minutes, allowed_slots, per_agent_cap) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT(goal_id) DO UPDATE SET compute = excluded.compute, \
                 window_hours = excluded.window_hours, slot_minutes = excluded.slot_minutes, \
                 allowed_slots = excluded.allowed_slots, per_agent_cap = excluded.per_agent_cap",
                params![goal_id, p.compute, p.window_hours, p.slot_minutes, p.allowed_slots, p.per_agent_cap],
            )
            .map_err(self.err("writing quota policy"))?;
        Ok(())
    }

    pub(super) fn ledger_entry(&self, effect_id: &str) -> Result<Option<LedgerEntry>> {
        self.query_opt(
            &format!("SELECT {LEDGER_COLUMNS} FROM quota_ledger WHERE effect_id = ?1"),
            [effect_id],
            ledger_from_row,
            "reading the ledger",
        )
    }

    pub(super) fn insert_ledger(&self, e: &LedgerEntry) -> Result<bool> {
        let n = self
            .conn
            .prepare_cached(&format!(
                "INSERT OR IGNORE INTO quota_ledger ({LEDGER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    e.effect_id,
                    e.goal_id,
                    e.agent_id,
                    e.run_id,
                    e.slots,
                    e.kind.as_str(),
                    e.voids_effect_id,
                    e.created_at
                ])
            })
            .map_err(self.err("writing the ledger"))?;
        Ok(n == 1)
    }

    pub(super) fn spent_since(
        &self,
        goal_id: &str,
        since: i64,
        agent_id: Option<&str>,
    ) -> Result<i64> {
        self.query_one(
            "SELECT COALESCE(SUM(slots), 0) FROM quota_ledger WHERE goal_id = ?1 AND created_at >= ?2 \
             AND (?3 IS NULL OR agent_id = ?3)",
            params![goal_id, since, agent_id],
            |r| r.get(0),
            "summing the ledger",
        )
    }

    pub(super) fn oldest_spend_since(&self, goal_id: &str, since: i64) -> Result<Option<i64>> {
        self.query_one(
            "SELECT MIN(created_at) FROM quota_ledger WHERE goal_id = ?1 AND created_at >= ?2 AND kind = 'spend'",
            params![goal_id, since],
            |r| r.get(0),
            "reading the ledger",
        )
    }

    pub(super) fn recent_ledger(&self, goal_id: &str, limit: usize) -> Result<Vec<LedgerEntry>> {
        self.query_all(
            &format!(
                "SELECT {LEDGER_COLUMNS} FROM quota_ledger WHERE goal_id = ?1 ORDER BY created_at DESC, effect_id LIMIT ?2"
            ),
            params![goal_id, limit as i64],
            ledger_from_row,
            "reading the ledger",
        )
    }
}
