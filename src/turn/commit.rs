//! One phase's commit, through the kernel.
//!
//! Why this exists: every phase is committed the same way: `Kernel::commit_turn_phase` checks the
//! row still has the phases this process last saw (a compare-and-swap), applies the phase's typed
//! effect, and stores the journal update this module builds from the effect's outcome, with the
//! timing and (on `terminal_closeout`) the settled status. The driver never opens a transaction.

use std::time::Instant;

use super::journal::JournalData;
use super::lock::crash_hook;
use super::{Phase, TurnResultKind};
use crate::error::{LoopxError, Result};
use crate::kernel::run::RunIds;
use crate::kernel::turn_journal::{EffectOutcome, PhaseEffect, PhaseWrite};
use crate::kernel::{Actor, Kernel};
use crate::model::{Run, TurnRecord};

/// Commits `phase` through the kernel (`Kernel::commit_turn_phase`): the row must still have the
/// phases we last saw; the kernel applies `effect`, `update` records its outcome in the journal
/// data (returning the run row when this phase records it), and the phase is appended (settling
/// the status on `terminal_closeout`), all in one transaction.
pub(crate) fn commit_phase(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    phase: Phase,
    started: Instant,
    effect: PhaseEffect,
    update: impl FnOnce(EffectOutcome, &mut JournalData, i64, &RunIds<'_>) -> Result<Option<Run>>,
) -> Result<()> {
    let mut next = data.clone();
    let actor = turn_actor(&rec.agent_id, &rec.turn_key);
    let stored = kernel.commit_turn_phase(
        &actor,
        &rec.turn_key,
        &rec.phases,
        phase,
        effect,
        |outcome, now, run_ids| {
            let run = update(outcome, &mut next, now, run_ids)?;
            let settle = if phase == Phase::TerminalCloseout {
                let kind = next.kind.unwrap_or(TurnResultKind::TerminalCloseoutFailed);
                next.settled_at = Some(now);
                Some(kind.journal_status())
            } else {
                None
            };
            next.timings_us.insert(
                phase.as_str().to_string(),
                started.elapsed().as_micros() as u64,
            );
            Ok(PhaseWrite {
                data: serde_json::to_value(&next).expect("journal data serializes"),
                settle,
                run,
            })
        },
    )?;
    *rec = stored;
    *data = next;
    crash_hook(phase.as_str());
    Ok(())
}

/// The kernel handed a phase an outcome of another effect than the one it asked for.
pub(crate) fn unexpected(phase: Phase, outcome: &EffectOutcome) -> LoopxError {
    LoopxError::internal(
        format!("committing turn phase {phase}"),
        anyhow::anyhow!("unexpected effect outcome {outcome:?}"),
    )
}

pub(crate) fn fail(data: &mut JournalData, kind: TurnResultKind, phase: Phase, why: String) {
    data.kind = Some(kind);
    data.failed_phase = Some(phase);
    data.failure = Some(why);
}

/// Who a turn's writes come from: its agent, inside the turn (the kernel refuses anyone else).
/// The lease proof is the kernel's to attach: it releases the lease only if this turn holds it.
pub(crate) fn turn_actor(agent_id: &str, turn_key: &str) -> Actor {
    Actor::Agent {
        agent_id: agent_id.to_string(),
        proof: None,
        turn_key: Some(turn_key.to_string()),
    }
}
