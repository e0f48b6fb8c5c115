//! A goal's provider probe (table `goal_probes`, migration 10): the SQLite side of
//! [`GoalProbeRead`] and [`GoalProbeTx`], one row per goal.

use super::*;
use crate::kernel::store::{GoalProbeRead, GoalProbeTx};
use crate::model::{CheckResult, GoalProbe, ProbeSpec};

const GOAL_PROBE_COLUMNS: &str = "goal_id, provider, operation, target, revision, ran_revision, \
     run_seq, runs, failures, last_result, last_digest, last_checked_at, last_failure, \
     last_observation, changed_at, created_at, updated_at";

fn goal_probe_from_row(row: &Row) -> rusqlite::Result<GoalProbe> {
    let last_result: Option<String> = row.get(9)?;
    let last_result = match last_result {
        Some(text) => Some(CheckResult::parse(&text).map_err(|e| bad_text(9, e))?),
        None => None,
    };
    Ok(GoalProbe {
        goal_id: row.get(0)?,
        spec: ProbeSpec {
            provider: row.get(1)?,
            operation: row.get(2)?,
            target: row.get(3)?,
        },
        revision: row.get(4)?,
        ran_revision: row.get(5)?,
        run_seq: row.get(6)?,
        runs: row.get(7)?,
        failures: row.get(8)?,
        last_result,
        last_digest: row.get(10)?,
        last_checked_at: row.get(11)?,
        last_failure: row.get(12)?,
        last_observation: row.get(13)?,
        changed_at: row.get(14)?,
        created_at: row.get(15)?,
        updated_at: row.get(16)?,
    })
}

impl<M: Mode> GoalProbeRead for SqliteTx<'_, M> {
    fn goal_probe(&self, goal_id: &str) -> Result<Option<GoalProbe>> {
        self.db.query_opt(
            &format!("SELECT {GOAL_PROBE_COLUMNS} FROM goal_probes WHERE goal_id = ?1"),
            [goal_id],
            goal_probe_from_row,
            "reading a goal probe",
        )
    }
}

impl GoalProbeTx for SqliteTx<'_, Write> {
    fn upsert_goal_probe(&self, p: &GoalProbe) -> Result<()> {
        self.db
            .conn
            .prepare_cached(&format!(
                "INSERT INTO goal_probes ({GOAL_PROBE_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17) \
                 ON CONFLICT (goal_id) DO UPDATE SET provider = ?2, operation = ?3, target = ?4, \
                 revision = ?5, ran_revision = ?6, run_seq = ?7, runs = ?8, failures = ?9, \
                 last_result = ?10, last_digest = ?11, last_checked_at = ?12, last_failure = ?13, \
                 last_observation = ?14, changed_at = ?15, created_at = ?16, updated_at = ?17"
            ))
            .and_then(|mut s| {
                s.execute(params![
                    p.goal_id,
                    p.spec.provider,
                    p.spec.operation,
                    p.spec.target,
                    p.revision,
                    p.ran_revision,
                    p.run_seq,
                    p.runs,
                    p.failures,
                    p.last_result.map(CheckResult::as_str),
                    p.last_digest,
                    p.last_checked_at,
                    p.last_failure,
                    p.last_observation,
                    p.changed_at,
                    p.created_at,
                    p.updated_at,
                ])
            })
            .map_err(self.db.err("writing a goal probe"))?;
        Ok(())
    }

    fn delete_goal_probe(&self, goal_id: &str) -> Result<()> {
        self.db
            .conn
            .prepare_cached("DELETE FROM goal_probes WHERE goal_id = ?1")
            .and_then(|mut s| s.execute([goal_id]))
            .map_err(self.db.err("deleting a goal probe"))?;
        Ok(())
    }
}
