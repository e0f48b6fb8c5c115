//! How a turn ended, as callers see it, and the read-only views of the journal.
//!
//! Why this exists: `turn run`, `turn inspect`, `turn list`, `loop` and recovery all report turns
//! in one shape (`loopx.turn_outcome.v1`), built from the journal row alone; reading it back
//! (`plan`, `inspect`, `list_turns`, a replay) writes nothing.

use serde::Serialize;

use super::isolation::Isolation;
use super::journal::{JournalData, journal_data};
use super::{JournalStatus, Phase, TurnResultKind};
use crate::error::{Result, bad_input, not_found};
use crate::ids::validate_token;
use crate::kernel::Kernel;
use crate::kernel::decision::{Decision, TurnRoute};
use crate::model::TurnRecord;

pub const OUTCOME_SCHEMA: &str = "loopx.turn_outcome.v1";

/// How a `turn run` (or one recovered turn) ended.
#[derive(Debug, Clone, Serialize)]
pub struct TurnOutcome {
    pub schema_version: &'static str,
    pub goal_id: String,
    pub agent_id: String,
    /// The route decided before the host (`ready_for_host` for every turn that ran).
    pub route: TurnRoute,
    pub reason: String,
    pub turn_key: Option<String>,
    pub todo_id: Option<String>,
    pub kind: Option<TurnResultKind>,
    pub status: Option<JournalStatus>,
    pub phases: Vec<Phase>,
    pub failed_phase: Option<Phase>,
    /// The host's summary, or what failed.
    pub detail: String,
    pub run_id: Option<String>,
    pub spent: bool,
    pub lease: Option<String>,
    /// A settled turn key was given: its stored result, no effects.
    pub replayed: bool,
    /// Finished by recovery rather than by the driver that started it.
    pub recovered: bool,
    /// Turns of this goal/agent that were settled before this one started.
    pub recovered_turns: Vec<String>,
    pub next_check_after_seconds: u64,
    pub elapsed_ms: u64,
    pub warnings: Vec<String>,
    /// No turn started because this live turn already works the lease (`turn run` exits 4).
    pub working_turn: Option<String>,
    /// The turn's delivery was proven: a validator ran and passed, or the todo's completion
    /// stands (validated or trusted with `--trust-host-completion`).
    pub validated: bool,
    /// How the host ran: `namespace` (kept out of `.loopx/`) or `none`.
    pub isolation: Isolation,
}

impl TurnOutcome {
    pub(crate) fn not_ready(
        d: &Decision,
        recovered_turns: Vec<String>,
        elapsed_ms: u64,
    ) -> TurnOutcome {
        TurnOutcome {
            schema_version: OUTCOME_SCHEMA,
            goal_id: d.goal_id.clone(),
            agent_id: d.agent_id.clone(),
            route: d.route,
            reason: d.reason.clone(),
            turn_key: None,
            todo_id: d.selected_todo.as_ref().map(|s| s.todo.id.clone()),
            kind: None,
            status: None,
            phases: Vec::new(),
            failed_phase: None,
            detail: d.reason.clone(),
            run_id: None,
            spent: false,
            lease: None,
            replayed: false,
            recovered: false,
            recovered_turns,
            next_check_after_seconds: d.next_check_after_seconds,
            elapsed_ms,
            warnings: Vec::new(),
            working_turn: d.working_turn.clone(),
            validated: false,
            isolation: Isolation::None,
        }
    }

    pub(crate) fn from_journal(rec: &TurnRecord, data: &JournalData) -> TurnOutcome {
        let detail = match (&data.failure, &data.result) {
            (Some(f), _) => f.clone(),
            (None, Some(r)) => r.summary.clone(),
            (None, None) => String::new(),
        };
        TurnOutcome {
            schema_version: OUTCOME_SCHEMA,
            goal_id: rec.goal_id.clone(),
            agent_id: rec.agent_id.clone(),
            route: TurnRoute::ReadyForHost,
            reason: data.route_reason.clone(),
            turn_key: Some(rec.turn_key.clone()),
            todo_id: rec.todo_id.clone(),
            kind: data.kind,
            status: Some(rec.status),
            phases: rec.phases.clone(),
            failed_phase: data.failed_phase,
            detail,
            run_id: data.run_id.clone(),
            spent: data.spend.is_some(),
            lease: data.lease.clone(),
            replayed: false,
            recovered: data.recovered,
            recovered_turns: Vec::new(),
            next_check_after_seconds: 0,
            elapsed_ms: data
                .settled_at
                .map(|s| (s - data.started_at).max(0) as u64)
                .unwrap_or(0),
            warnings: Vec::new(),
            working_turn: None,
            validated: data
                .validation
                .as_ref()
                .is_some_and(|v| (v.ran && v.passed) || v.completion_validated),
            isolation: data.isolation,
        }
    }

    /// One line for people: `t4 validated_progress 1.2s`.
    pub fn short_line(&self) -> String {
        let what = match self.kind {
            Some(k) => k.to_string(),
            None => format!("route {}", self.route),
        };
        format!(
            "{} {} {:.1}s",
            self.todo_id.as_deref().unwrap_or("-"),
            what,
            self.elapsed_ms as f64 / 1000.0
        )
    }
}

/// The decision a `turn run` would act on. A pure read.
pub fn plan(kernel: &mut Kernel, goal_id: &str, agent_id: &str) -> Result<Decision> {
    kernel.should_run(goal_id, agent_id)
}

/// The journal row of a turn.
pub fn inspect(kernel: &mut Kernel, turn_key: &str) -> Result<TurnRecord> {
    validate_token("turn key", turn_key)?;
    kernel.turn(turn_key)?.ok_or_else(|| {
        not_found(format!(
            "no turn '{turn_key}' in the journal; turn keys are printed by `loopx turn run`"
        ))
    })
}

/// The newest `limit` turns of the journal, optionally of one goal and one status, newest first.
/// An unknown goal is `NotFound` (exit 3), a limit of 0 `BadInput`.
pub fn list_turns(
    kernel: &mut Kernel,
    goal_id: Option<&str>,
    status: Option<JournalStatus>,
    limit: usize,
) -> Result<Vec<TurnRecord>> {
    if limit == 0 {
        return Err(bad_input("--limit must be at least 1"));
    }
    kernel.recent_turns(goal_id, status, limit)
}

/// The stored outcome of a turn (settled or not), without effects.
pub fn stored_outcome(kernel: &mut Kernel, turn_key: &str) -> Result<TurnOutcome> {
    let rec = inspect(kernel, turn_key)?;
    let data = journal_data(&rec)?;
    let mut o = TurnOutcome::from_journal(&rec, &data);
    o.replayed = true;
    Ok(o)
}
