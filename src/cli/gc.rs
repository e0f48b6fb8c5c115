//! `loopx gc [--apply]` and `loopx gc policy`: retention, which an operator controls.
//!
//! `gc` alone is a dry run: it prints every change it would make and the bytes it would free, and
//! changes nothing. `--apply` makes those changes (`kernel::retention`). `gc policy` shows the
//! retention policy, or changes the fields given. Agents are refused by the kernel.

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::Result;
use crate::kernel::retention::{GcReport, PolicyChange, PolicyView};

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct GcArgs {
    #[command(subcommand)]
    pub command: Option<GcCommand>,
    /// Make the changes (without it, `gc` only prints what it would do).
    #[arg(long)]
    pub apply: bool,
}

#[derive(Debug, Subcommand)]
pub enum GcCommand {
    /// Print a run's JSON report by id: its file, or (once gc retired the month's report files)
    /// the same report rendered from the database.
    #[command(name = "run-report")]
    RunReport {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The run (its id, as `history` shows it).
        #[arg(long)]
        run_id: String,
    },
    /// Show the retention policy, or change the fields given (operators only).
    Policy {
        /// Days finished todos and settled runs stay in `state.json` and `STATE.md`.
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::retention_days)]
        live_window_days: Option<i64>,
        /// Days a settled turn keeps its full journal before gc compacts it to its summary.
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::retention_days)]
        journal_full_days: Option<i64>,
        /// Never compact turn journals (keep request and output bodies for good).
        #[arg(long)]
        keep_journal_bodies: Option<bool>,
        /// Days each run keeps its own report files before gc packs them per month.
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::retention_days)]
        report_files_days: Option<i64>,
        /// Days runs keep their full payload; gc drops older payloads (the run row stays).
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::retention_days)]
        history_days: Option<i64>,
    },
}

pub fn run(ctx: &Context, args: GcArgs) -> Result<Output> {
    let actor = ctx.operator_or_agent();
    match args.command {
        Some(GcCommand::Policy {
            live_window_days,
            journal_full_days,
            keep_journal_bodies,
            report_files_days,
            history_days,
        }) => {
            let change = PolicyChange {
                live_window_days,
                journal_full_days,
                keep_journal_bodies,
                report_files_days,
                history_days,
            };
            let changing = live_window_days.is_some()
                || journal_full_days.is_some()
                || keep_journal_bodies.is_some()
                || report_files_days.is_some()
                || history_days.is_some();
            let view = if changing {
                ctx.kernel()?.set_retention_policy(&actor, &change)?
            } else {
                ctx.kernel()?.retention_policy()?
            };
            Ok(policy_output(&view, changing))
        }
        Some(GcCommand::RunReport { goal_id, run_id }) => {
            let (report, file) = ctx.kernel()?.run_report(&goal_id, &run_id)?;
            let source = match &file {
                Some(path) => path.display().to_string(),
                None => "rendered from the database".to_string(),
            };
            let text = serde_json::to_string_pretty(&report).unwrap_or_default();
            Ok(Output::new(json!({"report": report, "file": file}))
                .heading(format!("Run {run_id}"))
                .fields([("source", source)])
                .para(text))
        }
        None => {
            let report = if args.apply {
                ctx.kernel()?.gc_apply(&actor)?
            } else {
                ctx.kernel()?.gc_plan(&actor)?
            };
            Ok(report_output(&report))
        }
    }
}

fn policy_output(view: &PolicyView, changed: bool) -> Output {
    let p = &view.policy;
    Output::new(json!({"policy": view, "changed": changed}))
        .heading(match (changed, view.stored) {
            (true, _) => "Retention policy changed",
            (false, true) => "Retention policy",
            (false, false) => "Retention policy (defaults)",
        })
        .fields([
            ("live window", format!("{} day(s)", p.live_window_days)),
            (
                "full journals",
                if p.keep_journal_bodies {
                    "kept for good".to_string()
                } else {
                    format!("{} day(s), then compacted", p.journal_full_days)
                },
            ),
            (
                "report files",
                format!("{} day(s), then packed per month", p.report_files_days),
            ),
            (
                "run payloads",
                format!("{} day(s), then dropped", p.history_days),
            ),
        ])
}

fn report_output(r: &GcReport) -> Output {
    let mut items: Vec<String> = Vec::new();
    for t in &r.turns {
        items.push(format!(
            "compact turn {} (goal {}): journal {} -> {} bytes",
            t.turn_key, t.goal_id, t.bytes_before, t.bytes_after
        ));
    }
    for p in &r.payloads {
        items.push(format!(
            "drop the payload of run {} (goal {}): {} -> {} bytes",
            p.run_id, p.goal_id, p.bytes_before, p.bytes_after
        ));
    }
    for m in &r.report_months {
        items.push(format!(
            "retire the report files of goal {} for {} ({} run(s); reports are rendered from the \
             database from then on): remove {} file(s), {} bytes on disk{}",
            m.goal_id,
            m.month,
            m.runs,
            m.files.len(),
            m.file_bytes,
            if m.mark_exists {
                " (month already marked)"
            } else {
                ""
            }
        ));
    }
    for t in &r.temp_files {
        items.push(format!(
            "remove {}, left by a write that was killed (process {}): {} bytes on disk",
            crate::inert::line(&t.path.display().to_string()),
            t.writer_pid,
            t.bytes
        ));
    }
    items.push(format!(
        "vacuum the database ({} bytes now, {} of them free pages)",
        r.database_bytes_before, r.database_free_bytes
    ));
    let heading = if r.applied {
        "gc applied".to_string()
    } else {
        "gc dry run: nothing was changed; `loopx gc --apply` makes these changes".to_string()
    };
    let mut fields = vec![
        ("turn journals", r.turns.len().to_string()),
        ("run payloads", r.payloads.len().to_string()),
        ("report months", r.report_months.len().to_string()),
        ("temp files", r.temp_files.len().to_string()),
        (
            "bytes freed",
            format!(
                "{} (rows and files) + up to {} (free pages the vacuum returns)",
                r.bytes_freed, r.database_free_bytes
            ),
        ),
    ];
    if let Some(after) = r.database_bytes_after {
        fields.push((
            "database",
            format!("{} -> {after} bytes", r.database_bytes_before),
        ));
    }
    let mut value = serde_json::to_value(r).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("planned_total_bytes".into(), json!(r.planned_total()));
    }
    Output::new(value)
        .heading(heading)
        .fields(fields)
        .list(items)
}
