//! The turn journal: one row per turn, upserted at each phase; unsettled rows hold their todo and
//! reserve a quota slot until they reach their spend phase.

use super::*;

impl Db<'_> {
    pub(super) fn turn(&self, turn_key: &str) -> Result<Option<TurnRecord>> {
        self.query_opt(
            &format!("SELECT {TURN_COLUMNS} FROM turns WHERE turn_key = ?1"),
            [turn_key],
            turn_from_row,
            "reading a turn",
        )
    }

    pub(super) fn upsert_turn(&self, t: &TurnRecord) -> Result<()> {
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO turns ({TURN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT(turn_key) DO UPDATE SET todo_id = excluded.todo_id, status = excluded.status, \
                 phases = excluded.phases, data = excluded.data, updated_at = excluded.updated_at"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    t.turn_key,
                    t.goal_id,
                    t.agent_id,
                    t.todo_id,
                    t.status.as_str(),
                    to_json(&t.phases),
                    to_json(&t.data),
                    t.created_at,
                    t.updated_at
                ])
            })
            .map_err(self.err("journaling a turn"))?;
        Ok(())
    }

    pub(super) fn unsettled_turns(&self, goal_id: Option<&str>) -> Result<Vec<TurnRecord>> {
        self.query_all(
            &format!(
                "SELECT {TURN_COLUMNS} FROM turns WHERE status = 'in_progress' AND (?1 IS NULL OR goal_id = ?1) \
                 ORDER BY created_at"
            ),
            [goal_id],
            turn_from_row,
            "listing unsettled turns",
        )
    }

    pub(super) fn reserved_slots(
        &self,
        goal_id: &str,
        agent_id: Option<&str>,
    ) -> Result<(i64, i64)> {
        // `turns_unsettled (status, goal_id)` bounds this by the goal's live turns, never by the
        // journal's history.
        self.query_one(
            "SELECT COUNT(*), COALESCE(SUM(agent_id = ?2), 0) FROM turns \
             WHERE status = 'in_progress' AND goal_id = ?1 AND instr(phases, '\"quota_spend\"') = 0",
            params![goal_id, agent_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
            "counting the slots reserved by running turns",
        )
    }

    pub(super) fn unsettled_turn_on(
        &self,
        goal_id: &str,
        todo_id: &str,
    ) -> Result<Option<(String, String)>> {
        self.query_opt(
            "SELECT turn_key, agent_id FROM turns \
             WHERE status = 'in_progress' AND goal_id = ?1 AND todo_id = ?2 LIMIT 1",
            params![goal_id, todo_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
            "finding the turn working a todo",
        )
    }

    pub(super) fn recent_turns(
        &self,
        goal_id: Option<&str>,
        status: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query_all(
            &format!(
                "SELECT {TURN_COLUMNS} FROM turns WHERE (?1 IS NULL OR goal_id = ?1) \
                 AND (?2 IS NULL OR status = ?2) ORDER BY created_at DESC, turn_key DESC LIMIT ?3"
            ),
            params![goal_id, status, limit],
            turn_from_row,
            "listing turns",
        )
    }
}
