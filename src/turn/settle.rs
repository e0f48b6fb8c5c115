//! The phases that record the turn's effects beyond the journal: durable writeback (admission and
//! the run row) and terminal closeout (the lease, and the run row when writeback wrote none).
//!
//! Why this exists: these two phases turn the host's result into goal state and history. Both
//! build the run row the same way and write its report after the commit, and both interpret what
//! the kernel did (the verdicts, the lease it found) into the turn's result kind.

use std::time::Instant;

use serde_json::{Value, json};

use super::capability::{BUILTIN, builtin_proposals, capability_payload, wasm_proposals};
use super::commit::{commit_phase, fail, unexpected};
use super::journal::{JournalData, WritebackRecord};
use super::result::HostStatus;
use super::{Phase, TurnResultKind};
use crate::error::Result;
use crate::kernel::Kernel;
use crate::kernel::transition::ProposalSource;
use crate::kernel::turn_journal::{EffectOutcome, LeaseHeld, LeaseOutcome, PhaseEffect};
use crate::model::{Run, TodoStatus, TurnRecord};

pub(crate) fn writeback(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    started: Instant,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let result = data
        .result
        .clone()
        .expect("writeback follows a parsed result");
    let todo_id = rec.todo_id.clone().unwrap_or_default();
    let completion_validated = data
        .validation
        .as_ref()
        .is_some_and(|v| v.completion_validated);
    let (proposals, call, revision, cap_error) = if data.capability == BUILTIN {
        (
            builtin_proposals(&todo_id, &rec.agent_id, &result, completion_validated),
            Value::Null,
            None,
            None,
        )
    } else {
        let payload = capability_payload(&rec.turn_key, &todo_id, &result, completion_validated);
        match wasm_proposals(
            kernel,
            &data.capability,
            &rec.goal_id,
            &rec.agent_id,
            payload,
        ) {
            Ok(made) => (made.proposals, made.call, made.revision, None),
            Err(e) => (Vec::new(), Value::Null, None, Some(e)),
        }
    };
    let effect = match &cap_error {
        Some(_) => PhaseEffect::JournalOnly,
        None => PhaseEffect::Admit {
            source: ProposalSource {
                goal_id: rec.goal_id.clone(),
                agent_id: Some(rec.agent_id.clone()),
                capability: data.capability.clone(),
                turn_key: Some(rec.turn_key.clone()),
                revision,
            },
            proposals: proposals.clone(),
            monitor_observation: result.monitor_observation.clone(),
        },
    };
    let rec_snapshot = rec.clone();
    let mut run_written: Option<Run> = None;
    commit_phase(
        kernel,
        rec,
        data,
        Phase::DurableWriteback,
        started,
        effect,
        |outcome, d, now, run_ids| {
            let mut wb = WritebackRecord {
                capability: d.capability.clone(),
                proposals: proposals.clone(),
                verdicts: Vec::new(),
                accepted: 0,
                refused: 0,
                error: cap_error.as_ref().map(|e| e.message.clone()),
                plugin_failure: cap_error.as_ref().and_then(|e| e.plugin_failure),
                todo_status_after: None,
                call,
            };
            if let Some(e) = &cap_error {
                fail(
                    d,
                    TurnResultKind::WritebackFailed,
                    Phase::DurableWriteback,
                    e.message.clone(),
                );
                d.writeback = Some(wb);
                return Ok(None);
            }
            let EffectOutcome::Admitted {
                report,
                todo_status_after: after,
            } = outcome
            else {
                return Err(unexpected(Phase::DurableWriteback, &outcome));
            };
            wb.verdicts = report.verdicts.clone();
            wb.accepted = report.accepted;
            wb.refused = report.refused;
            wb.todo_status_after = after;
            d.writeback = Some(wb);
            let kind = if !proposals.is_empty() && report.accepted == 0 {
                let first = report
                    .verdicts
                    .first()
                    .map(|v| format!("{}: {}", v.transition, v.reason))
                    .unwrap_or_default();
                fail(
                    d,
                    TurnResultKind::WritebackFailed,
                    Phase::DurableWriteback,
                    format!("every proposal was refused (first: {first})"),
                );
                TurnResultKind::WritebackFailed
            } else {
                let k = match result.status {
                    HostStatus::Completed if after == Some(TodoStatus::Completed) => {
                        TurnResultKind::ValidatedCompletion
                    }
                    HostStatus::Progress | HostStatus::Completed => {
                        TurnResultKind::ValidatedProgress
                    }
                    HostStatus::RepairRequired => TurnResultKind::RepairRequired,
                    HostStatus::ReplanRequired => TurnResultKind::ReplanRequired,
                    HostStatus::UserActionRequired => TurnResultKind::UserActionRequired,
                    HostStatus::Wait => TurnResultKind::Wait,
                };
                d.kind = Some(k);
                k
            };
            let run = make_run(&rec_snapshot, d, kind, now, run_ids.next()?);
            d.run_id = Some(run.id.clone());
            run_written = Some(run.clone());
            Ok(Some(run))
        },
    )?;
    if let Some(run) = run_written {
        write_report(kernel, &run, warnings);
    }
    Ok(())
}

/// Releases the lease (unless completion or a block already cleared it), records the run row when
/// no earlier phase did, and settles the journal status.
pub(crate) fn closeout(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    started: Instant,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let snapshot = rec.clone();
    let mut run_written: Option<Run> = None;
    commit_phase(
        kernel,
        rec,
        data,
        Phase::TerminalCloseout,
        started,
        PhaseEffect::Release(LeaseHeld::Fence(data.claim.fence)),
        |outcome, d, now, run_ids| {
            let EffectOutcome::Lease(lease) = outcome else {
                return Err(unexpected(Phase::TerminalCloseout, &outcome));
            };
            let lease = match lease {
                LeaseOutcome::TodoGone => "not_held: the todo no longer exists".to_string(),
                LeaseOutcome::Cleared => "cleared".to_string(),
                LeaseOutcome::NotHeld(c) => {
                    format!("not_held: taken over by {} (fence {})", c.agent_id, c.fence)
                }
                LeaseOutcome::Released(_) => "released".to_string(),
                LeaseOutcome::Refused(e) => {
                    fail(
                        d,
                        TurnResultKind::TerminalCloseoutFailed,
                        Phase::TerminalCloseout,
                        format!("the lease could not be released: {e}"),
                    );
                    format!("not_released: {e}")
                }
            };
            d.lease = Some(lease);
            if d.kind.is_none() {
                fail(
                    d,
                    TurnResultKind::TerminalCloseoutFailed,
                    Phase::TerminalCloseout,
                    "the turn reached closeout without a result kind".to_string(),
                );
            }
            if d.run_id.is_some() {
                return Ok(None);
            }
            let kind = d.kind.expect("set above");
            let run = make_run(&snapshot, d, kind, now, run_ids.next()?);
            d.run_id = Some(run.id.clone());
            run_written = Some(run.clone());
            Ok(Some(run))
        },
    )?;
    if let Some(run) = run_written {
        write_report(kernel, &run, warnings);
    } else if let Some(run_id) = &data.run_id {
        // A recovered turn whose report was not written before the crash.
        if !kernel.paths().run_json(&rec.goal_id, run_id).exists()
            && let Some(run) = kernel.run(&rec.goal_id, run_id)?
        {
            write_report(kernel, &run, warnings);
        }
    }
    Ok(())
}

fn make_run(
    rec: &TurnRecord,
    data: &JournalData,
    kind: TurnResultKind,
    now: i64,
    id: String,
) -> Run {
    let summary = match (&data.failure, &data.result) {
        (Some(f), _) => format!("{kind}: {f}"),
        (None, Some(r)) if !r.summary.trim().is_empty() => r.summary.clone(),
        _ => kind.to_string(),
    };
    let summary: String = summary.chars().take(4000).collect();
    Run {
        id,
        goal_id: rec.goal_id.clone(),
        agent_id: Some(rec.agent_id.clone()),
        todo_id: rec.todo_id.clone(),
        classification: kind.as_str().to_string(),
        outcome: data.result.as_ref().map(|r| r.status.as_str().to_string()),
        summary,
        payload: json!({
            "turn_key": rec.turn_key,
            "kind": kind,
            "capability": data.capability,
            "host": data.host.as_ref().map(|h| json!({
                "argv": data.host_argv,
                "exit_code": h.exit_code,
                "signal": h.signal,
                "timed_out": h.timed_out,
                "interrupted": h.interrupted,
                "elapsed_ms": h.elapsed_ms,
                "stdout_bytes": h.stdout_bytes,
                "outcome": h.describe(),
            })),
            "result": data.result,
            "result_error": data.result_error,
            "validation": data.validation.as_ref().map(|v| json!({
                "ran": v.ran, "passed": v.passed, "completion_validated": v.completion_validated, "detail": v.detail,
            })),
            "writeback": data.writeback.as_ref().map(|w| json!({
                "capability": w.capability, "accepted": w.accepted, "refused": w.refused,
                "verdicts": w.verdicts, "error": w.error,
            })),
            "failed_phase": data.failed_phase,
            "failure": data.failure,
        }),
        created_at: now,
    }
}

fn write_report(kernel: &Kernel, run: &Run, warnings: &mut Vec<String>) {
    if kernel.paths().run_json(&run.goal_id, &run.id).exists() {
        return;
    }
    if let Err(e) = kernel.write_run_report(run) {
        warnings.push(format!("run report {}: {e}", run.id));
    }
}
