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
use crate::plugin::error::PluginErrorKind;

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
    /// Which sandbox limit or fault stopped the turn's capability, when one did (the same
    /// spelling as `error.plugin_failure` of `capability invoke`).
    pub plugin_failure: Option<PluginErrorKind>,
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
            plugin_failure: None,
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
            plugin_failure: data.writeback.as_ref().and_then(|w| w.plugin_failure),
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
    if rec.data.get("compacted").is_some() {
        let summary = match &data.run_id {
            Some(run_id) => kernel.run(&rec.goal_id, run_id)?.map(|r| r.summary),
            None => None,
        };
        restore_compacted(&mut o, &rec, summary);
    }
    o.replayed = true;
    Ok(o)
}

/// Fills in what `loopx gc` moved out of a compacted journal (`model::compact_journal_data`):
/// whether the delivery was validated (kept in `compacted`), and the host's summary (the run's
/// summary). The route's reason is not kept.
fn restore_compacted(o: &mut TurnOutcome, rec: &TurnRecord, run_summary: Option<String>) {
    let compacted = &rec.data["compacted"];
    o.validated = compacted["validated"] == true;
    if o.detail.is_empty()
        && let Some(summary) = run_summary
    {
        o.detail = summary;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::model::{COMPACTED_KEYS, compact_journal_data};

    /// A settled turn's journal as the driver wrote it (a host with stderr and an observation,
    /// a validator with output).
    const SETTLED: &str = r#"{"capability":"builtin:default","claim":{"claim_key":"turn-01M8TE60RDFZHTJKZH5W97VB80","expires_at":1796185722413,"fence":1},"cwd":"/work/p","driver_pid":17529,"failed_phase":null,"failure":null,"host":{"elapsed_ms":13,"exit_code":0,"interrupted":false,"pid":17532,"signal":null,"spawn_error":null,"stderr_tail":"some log\n","stdout":"{\"schema_version\":\"loopx.turn_result.v1\",\"status\":\"progress\",\"summary\":\"worked\",\"evidence\":[{\"text\":\"ev\"}],\"observations\":[{\"kind\":\"k\",\"data\":{\"a\":1}}]}","stdout_bytes":152,"stdout_oversized":false,"stdout_utf8":true,"timed_out":false},"host_argv":["/work/p/host2.sh"],"isolation":"namespace","kind":"validated_progress","lease":"released","orphans_killed":[],"project_root":"/work/p","recovered":false,"request":{"agent_id":"a1","claim":{"claim_key":"turn-01M8TE60RDFZHTJKZH5W97VB80","expires_at":"2026-12-02T04:28:42.413Z","fence":1},"deadline_seconds":1800,"goal":{"id":"g","objective":"T","project_dir":"/work/p","success_criteria":[],"title":"T"},"result_schema":{"fields":{"evidence":"at most 32 of {\"text\": string, \"artifact_path\"?: string}","observations":"at most 64 of {\"kind\": string, \"data\": any JSON}, passed to the todo's capability","proposals":"optional kernel transitions (builtin:default capability only)","schema_version":"required, \"loopx.turn_result.v1\"","status":"required, one of progress, completed, repair_required, replan_required, user_action_required, wait","summary":"string, at most 2000 bytes","turn_key":"optional; when present must equal the request's turn_key"},"max_stdout_bytes":65536,"schema_version":"loopx.turn_result.v1","stdout":"exactly one JSON object; nothing else on stdout (use stderr for logs)","unknown_fields":"refused"},"schema_version":"loopx.turn_request.v1","todo":{"capability":"builtin:default","detail":"","id":"t99","lane":null,"priority":"P2","title":"work t99"},"turn_key":"turn-01M8TE60RDFZHTJKZH5W97VB80","validator":true},"result":{"evidence":[{"text":"ev"}],"observations":[{"data":{"a":1},"kind":"k"}],"proposals":[],"schema_version":"loopx.turn_result.v1","status":"progress","summary":"worked"},"result_error":null,"route_reason":"todo 't99' [P2] is ready: work t99","run_id":"01M8TE60TWR7N03SDJ0434C1TA","schema_version":"loopx.turn_journal.v1","settled_at":1796183622510,"spend":{"effect_id":"turn:turn-01M8TE60RDFZHTJKZH5W97VB80","idempotent_replay":false,"slots":1},"started_at":1796183622413,"timeout_ms":1800000,"timings_us":{"durable_writeback":727,"host_execute":18025,"quota_spend":1090,"start":6512,"terminal_closeout":720,"typed_result":483,"validation":29082},"trust_host_completion":false,"validate_argv":["/bin/sh","-c","cat >/dev/null; echo validator-log"],"validation":{"completion_validated":false,"detail":"validator exited with status 0","passed":true,"ran":true,"validator":{"elapsed_ms":25,"exit_code":0,"interrupted":false,"pid":17537,"signal":null,"spawn_error":null,"stderr_tail":"","stdout":"validator-log\n","stdout_bytes":14,"stdout_oversized":false,"stdout_utf8":true,"timed_out":false}},"writeback":{"accepted":1,"call":null,"capability":"builtin:default","error":null,"proposals":[{"artifact_digest":null,"artifact_path":null,"text":"ev","todo_id":"t99","type":"attach_evidence"}],"refused":0,"todo_status_after":"claimed","verdicts":[{"accepted":true,"index":0,"reason":"evidence attached to 't99'","todo_id":"t99","transition":"attach_evidence"}]}}"#;

    fn record(data: serde_json::Value) -> TurnRecord {
        TurnRecord {
            turn_key: "turn-01M8TE60RDFZHTJKZH5W97VB80".into(),
            goal_id: "g".into(),
            agent_id: "a1".into(),
            todo_id: Some("t99".into()),
            status: JournalStatus::Committed,
            phases: vec![Phase::HostExecute, Phase::TypedResult, Phase::Validation],
            data,
            created_at: 1,
            updated_at: 2,
            data_error: None,
        }
    }

    #[test]
    fn a_compacted_journal_reads_as_the_same_outcome_and_is_a_quarter_of_the_size() {
        let key = "turn-01M8TE60RDFZHTJKZH5W97VB80";
        let full: serde_json::Value = serde_json::from_str(SETTLED).unwrap();
        let compacted = compact_journal_data(&full, key);
        let data = journal_data(&record(compacted.clone())).expect("still a journal");
        let before = TurnOutcome::from_journal(
            &record(full.clone()),
            &journal_data(&record(full.clone())).unwrap(),
        );
        let mut after = TurnOutcome::from_journal(&record(compacted.clone()), &data);
        restore_compacted(
            &mut after,
            &record(compacted.clone()),
            Some("worked".into()),
        );
        let shown = |o: &TurnOutcome| {
            let mut v = serde_json::to_value(o).unwrap();
            v.as_object_mut().unwrap().remove("reason");
            v
        };
        assert_eq!(
            shown(&before),
            shown(&after),
            "the outcome `turn inspect` and a replay show is unchanged but for the route's reason"
        );
        assert_eq!(after.detail, "worked");
        assert!(after.validated);
        let text = compacted.to_string();
        for gone in [
            "validator-log\\n",
            "some log",
            "result_schema",
            "observations",
            "timings_us",
        ] {
            assert!(!text.contains(gone), "{gone} left in {text}");
        }
        for key in COMPACTED_KEYS {
            let mut v = &compacted;
            for part in key.split('.') {
                v = &v[part];
            }
            let empty = v.is_null() || *v == json!("") || *v == json!([]);
            assert!(empty, "{key} left: {v}");
        }
        assert_eq!(compacted["compacted"]["verdicts"][0][2], true, "{text}");
        assert_eq!(
            compacted["compacted"]["validator"]["exit_code"], 0,
            "{text}"
        );
        assert!(
            text.len() * 4 < full.to_string().len(),
            "{} of {}",
            text.len(),
            full.to_string().len()
        );
        assert_eq!(
            compact_journal_data(&compacted, key),
            compacted,
            "compacting twice changes nothing"
        );
    }
}
