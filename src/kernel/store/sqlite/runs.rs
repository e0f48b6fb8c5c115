//! The run log, evidence and reward overlays: append-only rows read newest first.

use super::*;

impl Db<'_> {
    pub(super) fn insert_evidence(&self, e: &Evidence) -> Result<i64> {
        self.conn
            .prepare_cached(
                "INSERT INTO evidence (goal_id, todo_id, text, artifact_path, artifact_digest, run_id, actor, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    e.goal_id,
                    e.todo_id,
                    e.text,
                    e.artifact_path,
                    e.artifact_digest,
                    e.run_id,
                    e.actor,
                    e.created_at
                ])
            })
            .map_err(self.err("inserting evidence"))?;
        Ok(self.conn.last_insert_rowid())
    }

    pub(super) fn evidence_for(&self, goal_id: &str, todo_id: &str) -> Result<Vec<Evidence>> {
        self.query_all(
            &format!(
                "SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE goal_id = ?1 AND todo_id = ?2 ORDER BY id"
            ),
            params![goal_id, todo_id],
            evidence_from_row,
            "reading evidence",
        )
    }

    pub(super) fn recent_evidence(&self, goal_id: &str, limit: usize) -> Result<Vec<Evidence>> {
        self.query_all(
            &format!(
                "SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE goal_id = ?1 ORDER BY id DESC LIMIT ?2"
            ),
            params![goal_id, limit as i64],
            evidence_from_row,
            "reading evidence",
        )
    }

    pub(super) fn newest_run_id(&self) -> Result<Option<String>> {
        // The last entry of the primary key's index.
        self.query_one(
            "SELECT MAX(id) FROM runs",
            [],
            |r| r.get(0),
            "finding the newest run id",
        )
    }

    pub(super) fn insert_run(&self, run: &Run) -> Result<()> {
        self.conn
            .prepare_cached(&format!(
                "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    run.id,
                    run.goal_id,
                    run.agent_id,
                    run.todo_id,
                    run.classification,
                    run.outcome,
                    run.summary,
                    to_json(&run.payload),
                    run.created_at
                ])
            })
            .map_err(self.err("inserting a run"))?;
        Ok(())
    }

    pub(super) fn run(&self, goal_id: &str, run_id: &str) -> Result<Option<Run>> {
        self.query_opt(
            &format!("SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND id = ?2"),
            params![goal_id, run_id],
            run_from_row,
            "reading a run",
        )
    }

    pub(super) fn runs(
        &self,
        goal_id: &str,
        limit: usize,
        before: Option<&str>,
    ) -> Result<Vec<Run>> {
        self.query_all(
            &format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE goal_id = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3"
            ),
            params![goal_id, before, limit as i64],
            run_from_row,
            "reading history",
        )
    }

    /// The id alone, read from an index (`runs_by_agent`, or the goal's newest by
    /// `runs_by_goal`): a spend and the attention queue need nothing else of the run.
    pub(super) fn latest_run_id(
        &self,
        goal_id: &str,
        agent_id: Option<&str>,
    ) -> Result<Option<String>> {
        let sql = match agent_id {
            Some(_) => {
                "SELECT id FROM runs WHERE goal_id = ?1 AND agent_id = ?2 ORDER BY id DESC LIMIT 1"
            }
            None => {
                "SELECT id FROM runs WHERE goal_id = ?1 AND ?2 IS NULL ORDER BY id DESC LIMIT 1"
            }
        };
        self.query_opt(
            sql,
            params![goal_id, agent_id],
            |r| r.get(0),
            "reading the latest run",
        )
    }

    pub(super) fn run_count(&self, goal_id: &str) -> Result<i64> {
        self.query_one(
            "SELECT COUNT(*) FROM runs WHERE goal_id = ?1",
            [goal_id],
            |r| r.get(0),
            "counting runs",
        )
    }

    pub(super) fn insert_reward(&self, r: &Reward) -> Result<i64> {
        self.conn
            .prepare_cached(
                "INSERT INTO rewards (goal_id, run_id, score, comment, actor, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| s.execute(params![r.goal_id, r.run_id, r.score, r.comment, r.actor, r.created_at]))
            .map_err(self.err("inserting a reward"))?;
        Ok(self.conn.last_insert_rowid())
    }

    pub(super) fn rewards_for_runs(
        &self,
        goal_id: &str,
        run_ids: &[String],
    ) -> Result<Vec<Reward>> {
        let mut out = Vec::new();
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, goal_id, run_id, score, comment, actor, created_at FROM rewards \
                 WHERE goal_id = ?1 AND run_id = ?2 ORDER BY id",
            )
            .map_err(self.err("reading rewards"))?;
        for run_id in run_ids {
            let rows: Vec<Reward> = stmt
                .query_map(params![goal_id, run_id], reward_from_row)
                .and_then(|rows| rows.collect())
                .map_err(self.err("reading rewards"))?;
            out.extend(rows);
        }
        Ok(out)
    }

    pub(super) fn recent_rewards(&self, goal_id: &str, limit: usize) -> Result<Vec<Reward>> {
        self.query_all(
            "SELECT id, goal_id, run_id, score, comment, actor, created_at FROM rewards \
             WHERE goal_id = ?1 ORDER BY id DESC LIMIT ?2",
            params![goal_id, limit as i64],
            reward_from_row,
            "reading rewards",
        )
    }
}
