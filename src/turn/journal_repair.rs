//! Journal rows that cannot be read back.
//!
//! A turn's row is the whole truth about the turn, so a row whose `data` does not decode (JSON
//! nested past serde_json's reader limit, invalid UTF-8, a damaged page) cannot be resumed. Left
//! alone it would keep its todo claimed and, before this module, failed every listing of the
//! journal, so one agent's output stopped `turn run` of every agent, `turn recover` and `turn
//! list` for the whole project. Recovery instead settles such a row as failed, with the reason,
//! and releases its lease; `doctor` reports every such row ([`undecodable_turns`]).
//!
//! The limits in [`super::result`] keep the driver from journaling such a row in the first place;
//! this is the path for rows written before those limits, or damaged afterwards.

use serde_json::json;

use super::journal::{ClaimInfo, JOURNAL_SCHEMA, JournalData};
use super::outcome::{TurnOutcome, stored_outcome};
use super::{JournalStatus, Phase, TurnResultKind};
use crate::error::Result;
use crate::kernel::turn_journal::{
    EffectOutcome, LeaseHeld, LeaseOutcome, PhaseEffect, PhaseWrite,
};
use crate::kernel::{Actor, Kernel};
use crate::model::Run;
use crate::model::TurnRecord;

/// Most bytes of the undecodable text kept in the settled row: enough to see what went wrong,
/// never a copy of an arbitrarily large damaged column.
const KEPT_TEXT: usize = 64 * 1024;

/// Why `rec` cannot be resumed, when it cannot: the store could not decode its columns, or its
/// `data` is JSON that is not a journal.
pub fn undecodable_reason(rec: &TurnRecord) -> Option<String> {
    if let Some(e) = &rec.data_error {
        return Some(e.clone());
    }
    serde_json::from_value::<JournalData>(rec.data.clone())
        .err()
        .map(|e| format!("data is not a {JOURNAL_SCHEMA} journal: {e}"))
}

/// Settles the unsettled turn `rec` whose journal cannot be decoded: status `failed`, kind
/// `host_failure`, the reason as the failure, the undecodable text kept (truncated) for
/// inspection, one run row (unless `durable_writeback` had already written one), and the lease
/// released when this turn's agent still holds it. Nothing else is resumed: no host, validator,
/// admission or spend runs from a journal that cannot be read. The caller holds the turn's lock.
pub(crate) fn settle_undecodable(
    kernel: &mut Kernel,
    rec: &TurnRecord,
    reason: &str,
) -> Result<TurnOutcome> {
    let kept: String = match &rec.data {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let kept = truncate(&kept, KEPT_TEXT);
    let failure = format!(
        "the journal row could not be decoded ({reason}); settled by recovery without resuming: \
         nothing more was run or spent, and the lease was released if this turn still held it"
    );
    let mut written: Option<Run> = None;
    let actor = Actor::Agent {
        agent_id: rec.agent_id.clone(),
        proof: None,
        turn_key: Some(rec.turn_key.clone()),
    };
    // The lease proof (fence, claim key) lived in the undecodable data, so ownership is read
    // from the todo: this turn's agent holds it, and held it no later than the row's last write
    // (a lease the agent claimed afterwards belongs to later work and is left alone).
    let effect = PhaseEffect::Release(LeaseHeld::ClaimedBy(rec.updated_at));
    kernel.commit_turn_phase(
        &actor,
        &rec.turn_key,
        &rec.phases,
        Phase::TerminalCloseout,
        effect,
        |outcome, now, run_ids| {
            let mut claim = ClaimInfo {
                fence: 0,
                claim_key: String::new(),
                expires_at: 0,
            };
            let lease = match outcome {
                EffectOutcome::Lease(LeaseOutcome::TodoGone) => {
                    "not_held: the todo no longer exists".to_string()
                }
                EffectOutcome::Lease(LeaseOutcome::Cleared) => "cleared".to_string(),
                EffectOutcome::Lease(LeaseOutcome::NotHeld(c)) => {
                    format!("not_held: held by {} (fence {})", c.agent_id, c.fence)
                }
                EffectOutcome::Lease(LeaseOutcome::Released(c)) => {
                    claim = ClaimInfo {
                        fence: c.fence,
                        claim_key: c.idempotency_key.clone(),
                        expires_at: c.expires_at,
                    };
                    "released".to_string()
                }
                EffectOutcome::Lease(LeaseOutcome::Refused(e)) => return Err(e),
                other => {
                    return Err(crate::error::LoopxError::internal(
                        "settling an undecodable journal row",
                        anyhow::anyhow!("unexpected effect outcome {other:?}"),
                    ));
                }
            };
            let kind = TurnResultKind::HostFailure;
            // `durable_writeback` commits the turn's run row with it; every other settled turn
            // gets exactly one here.
            let run = if rec.phases.contains(&Phase::DurableWriteback) {
                None
            } else {
                Some(Run {
                    id: run_ids.next()?,
                    goal_id: rec.goal_id.clone(),
                    agent_id: Some(rec.agent_id.clone()),
                    todo_id: rec.todo_id.clone(),
                    classification: kind.as_str().to_string(),
                    outcome: None,
                    summary: truncate(&format!("{kind}: {failure}"), 4000),
                    payload: json!({
                        "turn_key": rec.turn_key,
                        "kind": kind,
                        "undecodable_journal": reason,
                        "lease": lease,
                    }),
                    created_at: now,
                })
            };
            let run_id = run.as_ref().map(|r| r.id.clone());
            written = run.clone();
            // Written as JSON rather than a `JournalData` literal: fields the driver adds with a
            // serde default (how the host was isolated, timings) then need nothing here, and the
            // row is checked to decode as a journal before it is stored. `undecodable_data` is
            // kept in the row for `turn inspect`; the driver ignores it.
            let data = json!({
                "schema_version": JOURNAL_SCHEMA,
                "request": null,
                "host_argv": [],
                "validate_argv": null,
                "timeout_ms": 0,
                "trust_host_completion": false,
                "capability": "",
                "cwd": "",
                "project_root": "",
                "claim": claim,
                "route_reason": "",
                "host": null,
                "result": null,
                "result_error": null,
                "validation": null,
                "writeback": null,
                "spend": null,
                "lease": lease,
                "kind": kind,
                "failed_phase": null,
                "failure": failure,
                "run_id": run_id,
                "recovered": true,
                "orphans_killed": [],
                "timings_us": {"terminal_closeout": 0},
                "driver_pid": std::process::id(),
                "started_at": rec.created_at,
                "settled_at": now,
                "undecodable_data": kept,
            });
            if let Err(e) = serde_json::from_value::<JournalData>(data.clone()) {
                return Err(crate::error::LoopxError::internal(
                    "settling an undecodable journal row",
                    anyhow::anyhow!("the replacement journal does not decode: {e}"),
                ));
            }
            Ok(PhaseWrite {
                data,
                settle: Some(JournalStatus::Failed),
                run,
            })
        },
    )?;
    let mut warnings = Vec::new();
    if let Some(run) = written
        && let Err(e) = kernel.write_run_report(&run)
    {
        warnings.push(format!("run report {}: {e}", run.id));
    }
    let mut o = stored_outcome(kernel, &rec.turn_key)?;
    o.replayed = false;
    o.warnings = warnings;
    Ok(o)
}

/// Every journal row that cannot be decoded, as `turn <key>: <reason>`, for `doctor`. Reads the
/// whole journal once; writes nothing.
pub fn undecodable_turns(kernel: &mut Kernel) -> Result<Vec<String>> {
    let rows = kernel.recent_turns(None, None, i64::MAX as usize)?;
    Ok(rows
        .iter()
        .filter_map(|rec| {
            undecodable_reason(rec).map(|why| {
                let fix = if rec.status == JournalStatus::InProgress {
                    "; `loopx turn recover` settles it as failed"
                } else {
                    ""
                };
                format!("turn {} ({}): {why}{fix}", rec.turn_key, rec.status)
            })
        })
        .collect())
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}
