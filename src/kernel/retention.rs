//! Retention: how long each kind of history is kept in full, and `loopx gc`, which shrinks what
//! has outlived that and gives the space back.
//!
//! A project that runs for months would otherwise grow without bound: every settled turn keeps
//! the full request and process output in its journal row, every run keeps a report pair in
//! `runs/`, and SQLite never returns a freed page to the filesystem by itself. The policy is the
//! operator's (stored in the database, changed only by an operator, each change in the operation
//! log); its defaults keep a year of history readable (docs/operator-guide.md, "Retention").
//!
//! `gc` is planned first and applied only when asked: the plan is a pure read that lists every
//! change and the bytes it frees. Applying works in small batches, each one transaction with its
//! own operation-log row naming what it changed, so a kill at any point leaves every batch either
//! done or not started, and running `gc` again finishes the work. What `gc` touches is settled
//! by construction: journals of settled turns only (the store refuses to compact an unsettled
//! one), payloads of runs older than `history_days`, report files of months wholly older than
//! `report_files_days` (their reports are rendered from the database from then on). Todos, leases, gates, evidence, the
//! quota ledger and the operation log are never touched, and every run and turn keeps its row.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::json;

use super::store::{CompactableTurn, RetentionPolicy};
use super::{Actor, Kernel, log_op};
use crate::clock::{DAY_MS, Rfc3339, complete_months, month_label, now_ms};
use crate::error::{LoopxError, Param, Result, bad_input, msg};
use crate::model::compact_journal_data;

/// The longest span a policy may name (about a century): beyond it the cut-off would leave the
/// range of the clock's arithmetic for no use.
pub const MAX_DAYS: i64 = 36_500;

/// How many rows one `gc` transaction changes: small enough that a batch holds the write lock
/// for milliseconds beside running loops, large enough that the operation log gets one row per
/// batch, not per turn.
const BATCH: usize = 200;

/// A change to the policy: the fields given replace the stored (or default) ones.
#[derive(Debug, Clone, Default)]
pub struct PolicyChange {
    pub live_window_days: Option<i64>,
    pub journal_full_days: Option<i64>,
    pub keep_journal_bodies: Option<bool>,
    pub report_files_days: Option<i64>,
    pub history_days: Option<i64>,
}

/// The policy in force and whether the operator set it.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyView {
    #[serde(flatten)]
    pub policy: RetentionPolicy,
    /// False while the defaults apply.
    pub stored: bool,
}

/// One settled turn whose journal `gc` compacts.
#[derive(Debug, Clone, Serialize)]
pub struct TurnCompaction {
    pub turn_key: String,
    pub goal_id: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// One run whose payload `gc` drops (older than `history_days`).
#[derive(Debug, Clone, Serialize)]
pub struct PayloadDrop {
    pub goal_id: String,
    pub run_id: String,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// One month of a goal's run report files that `gc` removes: the month is wholly older than
/// `report_files_days`, and its reports are rendered from the database on demand from then on.
#[derive(Debug, Clone, Serialize)]
pub struct ReportRetirement {
    pub goal_id: String,
    /// `YYYY-MM`.
    pub month: String,
    pub runs: usize,
    /// The month's mark (`runs/<month>.retired`), and whether a previous `gc` wrote it.
    pub mark: PathBuf,
    pub mark_exists: bool,
    /// The report files it removes, and the bytes they take on disk.
    pub files: Vec<PathBuf>,
    pub file_bytes: u64,
}

/// A temp file a projection write left when its process was killed mid-write: its writer is
/// gone and it is older than [`STALE_TEMP_AGE_MS`]. Nothing reads it; `gc` removes it.
#[derive(Debug, Clone, Serialize)]
pub struct StaleTempFile {
    pub path: PathBuf,
    pub writer_pid: u32,
    pub bytes: u64,
}

/// How old a temp file of a dead writer must be before `gc` removes it: a write takes
/// milliseconds, so anything this old was abandoned, even if its pid was reused meanwhile.
const STALE_TEMP_AGE_MS: u128 = 60_000;

/// What `gc` would do (dry run) or did (`--apply`).
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    pub applied: bool,
    pub policy: RetentionPolicy,
    pub now: Rfc3339,
    pub turns: Vec<TurnCompaction>,
    pub payloads: Vec<PayloadDrop>,
    pub report_months: Vec<ReportRetirement>,
    pub temp_files: Vec<StaleTempFile>,
    /// Bytes the rows and files above free (before the vacuum).
    pub bytes_freed: u64,
    /// The database files' size before, and (applied) after the vacuum.
    pub database_bytes_before: u64,
    pub database_bytes_after: Option<u64>,
    /// Free pages inside the database now, which a vacuum gives back on top.
    pub database_free_bytes: u64,
}

impl GcReport {
    /// `bytes_freed` plus the free pages the vacuum gives back.
    pub fn planned_total(&self) -> u64 {
        self.bytes_freed + self.database_free_bytes
    }
}

fn check_days(param: Param, days: i64) -> Result<()> {
    if !(0..=MAX_DAYS).contains(&days) {
        return Err(bad_input(msg![
            param,
            format!(" {days} is out of range: give whole days from 0 to {MAX_DAYS}")
        ]));
    }
    Ok(())
}

/// The policy in force given the stored row.
fn in_force(stored: Option<RetentionPolicy>) -> PolicyView {
    PolicyView {
        policy: stored.unwrap_or(RetentionPolicy::DEFAULT),
        stored: stored.is_some(),
    }
}

/// Bytes a file takes on disk (its allocated blocks), 0 when it is gone.
fn disk_bytes(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.blocks() * 512)
        .unwrap_or(0)
}

impl Kernel {
    /// The retention policy in force.
    pub fn retention_policy(&self) -> Result<PolicyView> {
        self.read(|tx| Ok(in_force(tx.retention().retention_policy()?)))
    }

    /// Changes the retention policy (operators only); the change is in the operation log.
    pub fn set_retention_policy(
        &mut self,
        actor: &Actor,
        change: &PolicyChange,
    ) -> Result<PolicyView> {
        actor.require_operator("change the retention policy")?;
        for (param, days) in [
            (Param::LiveWindowDays, change.live_window_days),
            (Param::JournalFullDays, change.journal_full_days),
            (Param::ReportFilesDays, change.report_files_days),
            (Param::HistoryDays, change.history_days),
        ] {
            if let Some(d) = days {
                check_days(param, d)?;
            }
        }
        self.write(|tx| {
            let before = in_force(tx.retention().retention_policy()?).policy;
            let after = RetentionPolicy {
                live_window_days: change.live_window_days.unwrap_or(before.live_window_days),
                journal_full_days: change.journal_full_days.unwrap_or(before.journal_full_days),
                keep_journal_bodies: change
                    .keep_journal_bodies
                    .unwrap_or(before.keep_journal_bodies),
                report_files_days: change.report_files_days.unwrap_or(before.report_files_days),
                history_days: change.history_days.unwrap_or(before.history_days),
            };
            tx.retention_tx().set_retention_policy(&after, now_ms())?;
            log_op(
                tx,
                None,
                actor,
                "retention_policy_set",
                json!({"before": before, "after": after}),
            )?;
            Ok(PolicyView {
                policy: after,
                stored: true,
            })
        })
    }

    /// What `gc` would do now: a pure read (operators only, like applying it).
    pub fn gc_plan(&self, actor: &Actor) -> Result<GcReport> {
        actor.require_operator("run gc")?;
        self.plan_at(now_ms())
    }

    fn plan_at(&self, now: i64) -> Result<GcReport> {
        let (policy, db_before, db_free) = {
            let policy = self.retention_policy()?.policy;
            let (bytes, free) = self.store.storage_bytes()?;
            (policy, bytes, free)
        };
        let mut turns = Vec::new();
        if !policy.keep_journal_bodies {
            let before = now - policy.journal_full_days * DAY_MS;
            // Keys past the last batch: each batch reads only keys and sizes, then each turn's
            // data to size its compacted form, so memory stays one batch.
            let candidates: Vec<CompactableTurn> =
                self.read(|tx| tx.retention().compactable_turns(before, usize::MAX))?;
            for chunk in candidates.chunks(BATCH) {
                self.read(|tx| {
                    for c in chunk {
                        if let Some(rec) = tx.turn(&c.turn_key)?
                            && rec.data_error.is_none()
                        {
                            let after = compact_journal_data(&rec.data, &rec.turn_key);
                            turns.push(TurnCompaction {
                                turn_key: c.turn_key.clone(),
                                goal_id: c.goal_id.clone(),
                                bytes_before: c.data_bytes.max(0) as u64,
                                bytes_after: json_len(&after),
                            });
                        }
                    }
                    Ok(())
                })?;
            }
        }
        let goals = self.goals()?;
        let mut payloads = Vec::new();
        let history_before = now - policy.history_days * DAY_MS;
        let dropped = dropped_payload();
        for g in &goals {
            let rows = self.read(|tx| {
                tx.retention()
                    .runs_with_payload_before(&g.id, history_before, usize::MAX)
            })?;
            payloads.extend(rows.into_iter().map(|(run_id, bytes)| PayloadDrop {
                goal_id: g.id.clone(),
                run_id,
                bytes_before: bytes.max(0) as u64,
                bytes_after: json_len(&dropped),
            }));
        }
        let mut report_months = Vec::new();
        let reports_before = now - policy.report_files_days * DAY_MS;
        for g in &goals {
            let Some(oldest) = self.read(|tx| tx.retention().oldest_run_at(&g.id))? else {
                continue;
            };
            for (start, end) in complete_months(oldest, reports_before) {
                let month = month_label(start);
                let mark = self.paths().retired_reports(&g.id, &month);
                // The month's report files, found one run at a time (payloads included, a
                // month of runs need not fit in memory).
                let (mut runs, mut files) = (0, Vec::new());
                self.read(|tx| {
                    tx.retention()
                        .visit_runs_created_between(&g.id, start, end, &mut |run| {
                            runs += 1;
                            for path in self.paths().run_report_files(&g.id, &run.id) {
                                if path.exists() {
                                    files.push(path);
                                }
                            }
                            Ok(())
                        })
                })?;
                let mark_exists = mark.exists();
                if files.is_empty() && (mark_exists || runs == 0) {
                    continue;
                }
                report_months.push(ReportRetirement {
                    goal_id: g.id.clone(),
                    month,
                    runs,
                    file_bytes: files.iter().map(|f| disk_bytes(f)).sum(),
                    mark,
                    mark_exists,
                    files,
                });
            }
        }
        let mut temp_files = Vec::new();
        stale_temp_files(&self.paths().state, &mut temp_files);
        let bytes_freed = turns
            .iter()
            .map(|t| t.bytes_before.saturating_sub(t.bytes_after))
            .chain(
                payloads
                    .iter()
                    .map(|p| p.bytes_before.saturating_sub(p.bytes_after)),
            )
            .chain(report_months.iter().map(|p| p.file_bytes))
            .chain(temp_files.iter().map(|t| t.bytes))
            .sum();
        Ok(GcReport {
            applied: false,
            policy,
            now: Rfc3339(now),
            turns,
            payloads,
            report_months,
            temp_files,
            bytes_freed,
            database_bytes_before: db_before,
            database_bytes_after: None,
            database_free_bytes: db_free,
        })
    }

    /// Runs `gc`: compacts the journals, drops the payloads and retires the report files of the
    /// plan, in batches each recorded in the operation log, then vacuums. Operators only.
    pub fn gc_apply(&mut self, actor: &Actor) -> Result<GcReport> {
        actor.require_operator("run gc")?;
        let _only_this_gc = self.hold_gc_lock()?;
        let now = now_ms();
        let mut report = self.plan_at(now)?;
        for chunk in report.turns.chunks(BATCH) {
            self.write(|tx| {
                let mut keys = Vec::with_capacity(chunk.len());
                let mut freed = 0u64;
                for t in chunk {
                    // Re-read in the write transaction: the store compacts only a settled,
                    // not yet compacted row, whatever happened since the plan.
                    let Some(rec) = tx.turn(&t.turn_key)? else {
                        continue;
                    };
                    if rec.data_error.is_some() {
                        continue;
                    }
                    let data = compact_journal_data(&rec.data, &rec.turn_key);
                    if tx.retention_tx().compact_turn(&t.turn_key, &data, now)? {
                        keys.push(t.turn_key.as_str());
                        freed += t.bytes_before.saturating_sub(t.bytes_after);
                    }
                }
                if !keys.is_empty() {
                    log_op(
                        tx,
                        None,
                        actor,
                        "gc_compact_turns",
                        json!({"turn_keys": keys, "bytes_freed": freed}),
                    )?;
                }
                Ok(())
            })?;
        }
        let dropped = dropped_payload();
        for chunk in report.payloads.chunks(BATCH) {
            self.write(|tx| {
                let mut by_goal: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
                for p in chunk {
                    if tx
                        .retention_tx()
                        .drop_run_payload(&p.goal_id, &p.run_id, &dropped, now)?
                    {
                        by_goal.entry(&p.goal_id).or_default().push(&p.run_id);
                    }
                }
                for (goal_id, run_ids) in by_goal {
                    log_op(
                        tx,
                        Some(goal_id),
                        actor,
                        "gc_drop_run_payloads",
                        json!({"run_ids": run_ids}),
                    )?;
                }
                Ok(())
            })?;
        }
        for month in &report.report_months {
            self.retire_reports(actor, month)?;
        }
        if !report.temp_files.is_empty() {
            let removed: Vec<String> = report
                .temp_files
                .iter()
                .map(|t| t.path.display().to_string())
                .collect();
            self.write(|tx| {
                log_op(
                    tx,
                    None,
                    actor,
                    "gc_remove_temp_files",
                    json!({"removed": removed}),
                )
            })?;
            for t in &report.temp_files {
                remove_if_present(&t.path)?;
            }
        }
        for g in self.goals()? {
            // The monthly archive of the goal's projections, written once per month.
            let since = now - report.policy.live_window_days * DAY_MS;
            let archived = self.write_goal_archives_before(&g.id, since);
            self.after_commit("writing the goal's monthly archive", archived);
        }
        // Giving the space back is the last step. Once the removals above committed, its
        // failure (a full disk: VACUUM needs room for a copy) cannot undo them, so it is a
        // warning and the command succeeds; the next `gc` vacuums again.
        match self.store.vacuum() {
            Ok((_, after)) => report.database_bytes_after = Some(after),
            Err(e) if self.has_committed() => {
                self.after_commit("giving the removed data's space back (VACUUM)", Err(e));
            }
            Err(e) => return Err(e),
        }
        report.applied = true;
        Ok(report)
    }

    /// One applying `gc` at a time per project (`.loopx/gc.lock`, held until the returned file
    /// is dropped): each logs the removals it planned before making them, so two at once would
    /// both log, and count, the same work.
    fn hold_gc_lock(&self) -> Result<std::fs::File> {
        let path = self.paths().state.join("gc.lock");
        let file = crate::state_file::open_own_file(&path)
            .map_err(|e| LoopxError::io(&path, format!("opening {}", path.display()), e))?;
        match crate::state_file::lock_exclusively(&file) {
            Ok(true) => Ok(file),
            Ok(false) => Err(crate::error::conflict(
                "another gc is applying its plan to this project; retry when it has finished",
            )),
            Err(e) => Err(LoopxError::io(
                &path,
                format!("locking {}", path.display()),
                e,
            )),
        }
    }

    /// Records the removal of one month's report files in the operation log, marks the month
    /// retired (so no later write re-creates its reports), then removes the files. A kill at any
    /// point leaves files the next `gc` finds and removes; every removal is logged before it
    /// happens.
    fn retire_reports(&mut self, actor: &Actor, month: &ReportRetirement) -> Result<()> {
        let files: Vec<String> = month
            .files
            .iter()
            .map(|f| f.display().to_string())
            .collect();
        self.write(|tx| {
            log_op(
                tx,
                Some(&month.goal_id),
                actor,
                "gc_retire_reports",
                json!({"month": month.month, "runs": month.runs, "removed": files}),
            )
        })?;
        if !month.mark_exists {
            let mark =
                json!({"month": month.month, "runs": month.runs, "retired_at": Rfc3339(now_ms())});
            super::projection::write_atomic(
                &month.mark,
                &serde_json::to_vec(&mark).unwrap_or_default(),
            )?;
        }
        for f in &month.files {
            remove_if_present(f)?;
        }
        // The month's directories of the sharded layout, once empty (ignored while not).
        let runs_dir = self.paths().runs_dir(&month.goal_id);
        let dirs: std::collections::BTreeSet<&std::path::Path> =
            month.files.iter().filter_map(|f| f.parent()).collect();
        for dir in dirs.into_iter().filter(|d| *d != runs_dir) {
            let _ = std::fs::remove_dir(dir);
        }
        Ok(())
    }
}

/// Removes `path`; one already gone (another `gc`, or its writer finishing) is not an error.
fn remove_if_present(path: &std::path::Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(LoopxError::io(
            path,
            format!("removing {}", path.display()),
            e,
        )),
    }
}

/// Collects under `dir` (recursively, following no symlink) the temp files of projection writes
/// whose writer is gone and that are older than [`STALE_TEMP_AGE_MS`]. Unreadable directories are
/// skipped: this is a sweep for litter, and `doctor` reports what cannot be read.
fn stale_temp_files(dir: &std::path::Path, out: &mut Vec<StaleTempFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        if kind.is_dir() {
            stale_temp_files(&path, out);
            continue;
        }
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(crate::state_file::temp_writer_pid)
        else {
            continue;
        };
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age.as_millis() >= STALE_TEMP_AGE_MS);
        if kind.is_file() && old && !crate::state_file::process_alive(pid) {
            out.push(StaleTempFile {
                path,
                writer_pid: pid,
                bytes: disk_bytes(&entry.path()),
            });
        }
    }
}

/// The payload a run keeps once `gc` dropped it: says so, so a reader of `history` knows the
/// snapshot existed.
fn dropped_payload() -> serde_json::Value {
    json!({"dropped_by_gc": true})
}

fn json_len(v: &serde_json::Value) -> u64 {
    serde_json::to_vec(v).map(|b| b.len() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Part;

    #[test]
    fn days_out_of_range_are_refused_naming_the_flag() {
        let e = check_days(Param::HistoryDays, -1).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let message = e.message().expect("a bad-input message");
        assert_eq!(message.parts()[0], Part::Param(Param::HistoryDays), "{e}");
        assert!(check_days(Param::HistoryDays, MAX_DAYS + 1).is_err());
        assert!(check_days(Param::HistoryDays, 0).is_ok());
    }
}
