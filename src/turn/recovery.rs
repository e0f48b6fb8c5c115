//! Settling turns whose driver is gone.
//!
//! Why this exists: a turn is unsettled while its journal says `in_progress`. Recovery takes the
//! turn's lock (so a turn still driven by a live process is left alone), kills whatever its dead
//! driver's host left running, and resumes the phase loop after the last committed phase; a row
//! that cannot be decoded is settled as failed instead (`journal_repair`).

use super::JournalStatus;
use super::host::kill_turn_processes;
use super::journal::journal_data;
use super::journal_repair::{settle_undecodable, undecodable_reason};
use super::lock::TurnLock;
use super::outcome::{TurnOutcome, inspect};
use super::phases::advance;
use crate::error::{LoopxError, Result};
use crate::ids::validate_token;
use crate::kernel::Kernel;

/// Settles the goal's turns whose driver is gone ([`recover`]) and names the ones it settled.
pub(crate) fn settle_orphans(kernel: &mut Kernel, goal_id: &str) -> Result<Vec<String>> {
    Ok(recover(kernel, Some(goal_id), None)?
        .into_iter()
        .filter(|o| o.status != Some(JournalStatus::InProgress))
        .filter_map(|o| o.turn_key)
        .collect())
}

/// Settles every unsettled turn (of `goal_id` / `agent_id` when given) whose driver is gone.
/// Turns still driven by a live process are reported with status `in_progress` and left alone.
pub fn recover(
    kernel: &mut Kernel,
    goal_id: Option<&str>,
    agent_id: Option<&str>,
) -> Result<Vec<TurnOutcome>> {
    if let Some(g) = goal_id {
        validate_token("goal id", g)?;
    }
    let keys: Vec<String> = kernel
        .unsettled_turns(goal_id)?
        .into_iter()
        .filter(|t| agent_id.is_none_or(|a| t.agent_id == a))
        .map(|t| t.turn_key)
        .collect();
    let mut out = Vec::new();
    for key in keys {
        match recover_one(kernel, &key) {
            // Settled by its own driver (or another recoverer) since the listing: not ours.
            Ok(Some(o)) if o.replayed => {}
            Err(LoopxError::Conflict(_)) => {}
            Ok(Some(o)) => out.push(o),
            Ok(None) => {
                let rec = inspect(kernel, &key)?;
                if rec.status != JournalStatus::InProgress {
                    continue;
                }
                // In flight elsewhere with a row that does not decode: its driver (or the next
                // recovery once that driver is gone) settles it; nothing to describe here.
                let Ok(data) = journal_data(&rec) else {
                    continue;
                };
                let mut o = TurnOutcome::from_journal(&rec, &data);
                o.detail = format!(
                    "in flight in another process (pid {}); left alone",
                    data.driver_pid
                );
                out.push(o);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Finishes one turn if no live process holds it. `None` when it is in flight elsewhere.
pub(crate) fn recover_one(kernel: &mut Kernel, turn_key: &str) -> Result<Option<TurnOutcome>> {
    let Some(lock) = TurnLock::try_acquire(kernel, turn_key)? else {
        return Ok(None);
    };
    let mut rec = inspect(kernel, turn_key)?;
    // A row that cannot be read back is settled as failed rather than blocking recovery.
    if rec.status == JournalStatus::InProgress
        && let Some(why) = undecodable_reason(&rec)
    {
        let o = settle_undecodable(kernel, &rec, &why);
        lock.finish();
        return o.map(Some);
    }
    let mut data = journal_data(&rec)?;
    if rec.status == JournalStatus::InProgress {
        data.recovered = true;
        // Whatever the dead driver's host left running is killed before the turn is settled.
        let killed = kill_turn_processes(turn_key);
        if !killed.is_empty() {
            data.orphans_killed = killed;
        }
        super::channel::remove_leftovers(turn_key);
        let warnings = advance(kernel, &mut rec, &mut data, false)?;
        let mut o = TurnOutcome::from_journal(&rec, &data);
        o.warnings = warnings;
        lock.finish();
        return Ok(Some(o));
    }
    lock.finish();
    let mut o = TurnOutcome::from_journal(&rec, &data);
    o.replayed = true;
    Ok(Some(o))
}
