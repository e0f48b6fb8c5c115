//! A goal's provider probe (table `goal_probes`, migrations 10 and 16): the SQLite side of
//! [`GoalProbeRead`] and [`GoalProbeTx`], one row per goal.

use serde::{Deserialize, Serialize};

use super::*;
use crate::kernel::store::{GoalProbeRead, GoalProbeTx};
use crate::model::{CheckResult, GoalProbe, ProbeSpec};

/// A goal probe's `state` column (migration 16): every field but the goal id, as one JSON object
/// read and written whole. Its field names are the stored format, apart from the model's.
#[derive(Serialize, Deserialize)]
struct GoalProbeState {
    provider: String,
    operation: String,
    target: String,
    revision: i64,
    ran_revision: i64,
    run_seq: i64,
    runs: i64,
    failures: i64,
    last_result: Option<CheckResult>,
    last_digest: Option<String>,
    last_checked_at: Option<i64>,
    last_failure: Option<String>,
    last_observation: Option<String>,
    changed_at: Option<i64>,
    created_at: i64,
    updated_at: i64,
}

fn goal_probe_from_row(row: &Row) -> rusqlite::Result<GoalProbe> {
    let s: GoalProbeState = json_col(row, 1)?;
    Ok(GoalProbe {
        goal_id: row.get(0)?,
        spec: ProbeSpec {
            provider: s.provider,
            operation: s.operation,
            target: s.target,
        },
        revision: s.revision,
        ran_revision: s.ran_revision,
        run_seq: s.run_seq,
        runs: s.runs,
        failures: s.failures,
        last_result: s.last_result,
        last_digest: s.last_digest,
        last_checked_at: s.last_checked_at,
        last_failure: s.last_failure,
        last_observation: s.last_observation,
        changed_at: s.changed_at,
        created_at: s.created_at,
        updated_at: s.updated_at,
    })
}

fn goal_probe_state(p: &GoalProbe) -> String {
    to_json(&GoalProbeState {
        provider: p.spec.provider.clone(),
        operation: p.spec.operation.clone(),
        target: p.spec.target.clone(),
        revision: p.revision,
        ran_revision: p.ran_revision,
        run_seq: p.run_seq,
        runs: p.runs,
        failures: p.failures,
        last_result: p.last_result,
        last_digest: p.last_digest.clone(),
        last_checked_at: p.last_checked_at,
        last_failure: p.last_failure.clone(),
        last_observation: p.last_observation.clone(),
        changed_at: p.changed_at,
        created_at: p.created_at,
        updated_at: p.updated_at,
    })
}

impl<M: Mode> GoalProbeRead for SqliteTx<'_, M> {
    fn goal_probe(&self, goal_id: &str) -> Result<Option<GoalProbe>> {
        self.db.query_opt(
            "SELECT goal_id, state FROM goal_probes WHERE goal_id = ?1",
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
            .prepare_cached(
                "INSERT INTO goal_probes (goal_id, state) VALUES (?1, ?2) \
                 ON CONFLICT (goal_id) DO UPDATE SET state = ?2",
            )
            .and_then(|mut s| s.execute(params![p.goal_id, goal_probe_state(p)]))
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
