//! `loopx loop`: repeat turns under a bounded budget (docs/turn-protocol.md, "The loop"); with
//! `--watch` the heartbeat that runs until a signal, with `--once` one cron-safe tick of it
//! (docs/operator-guide.md, "The heartbeat").

use std::io::Write;

use clap::Args;
use serde_json::json;

use super::output::Output;
use super::turn::TurnArgs;
use super::{Context, opt};
use crate::error::Result;
use crate::model::ProbeSpec;
use crate::turn::host::install_stop_handlers;
use crate::turn::loop_ctl::{
    DEFAULT_MAX_UNVALIDATED_TURNS, HeartbeatRequest, LoopDisposition, LoopEvent, LoopRequest,
    run_heartbeat, run_loop,
};
use crate::turn::probe_call::call_probe;

#[derive(Debug, Args)]
pub struct LoopArgs {
    #[command(flatten)]
    pub turn: TurnArgs,
    /// Most turns this loop runs (default 10; with --watch or --once, no limit).
    #[arg(long, allow_hyphen_values = true, value_parser = super::flags::max_turns)]
    pub max_turns: Option<u32>,
    /// The heartbeat: run due monitors and turns, sleep until the next thing is due or the state
    /// changes, and go on until SIGTERM/SIGINT.
    #[arg(long, conflicts_with_all = ["once", "until_idle"])]
    pub watch: bool,
    /// One heartbeat tick (for cron or a systemd timer): run what is due now, then exit. Safe to
    /// run overlapping: a check or turn another tick claimed is not run again.
    #[arg(long, conflicts_with = "until_idle")]
    pub once: bool,
    /// Stop once nothing is runnable for this agent and no other agent holds work on the goal
    /// (instead of sleeping until something is).
    #[arg(long)]
    pub until_idle: bool,
    /// Longest sleep between decisions (default: 1 with --until-idle, 3600 with --watch or
    /// --once, else 60).
    #[arg(long, allow_hyphen_values = true, value_parser = super::flags::max_sleep_seconds)]
    pub max_sleep_seconds: Option<u64>,
    /// Failed turns in a row after which the loop stops with `repair`.
    #[arg(long, default_value_t = 2, allow_hyphen_values = true, value_parser = super::flags::loop_count)]
    pub max_consecutive_failures: u32,
    /// Turns in a row on one todo whose delivery no validator proved, after which the loop stops
    /// with `no_validated_progress` instead of spending more quota.
    #[arg(long, default_value_t = DEFAULT_MAX_UNVALIDATED_TURNS, allow_hyphen_values = true, value_parser = super::flags::loop_count)]
    pub max_unvalidated_turns: u32,
}

pub fn run(ctx: &Context, args: LoopArgs) -> Result<Output> {
    if args.watch || args.once {
        return heartbeat(ctx, args);
    }
    let mut kernel = ctx.kernel()?;
    let req = LoopRequest {
        turn: args.turn.request(ctx)?,
        max_turns: args.max_turns.unwrap_or(10),
        until_idle: args.until_idle,
        max_sleep_seconds: args
            .max_sleep_seconds
            .unwrap_or(if args.until_idle { 1 } else { 60 }),
        max_consecutive_failures: args.max_consecutive_failures,
        max_unvalidated_turns: args.max_unvalidated_turns,
    };
    install_stop_handlers();
    let max = req.max_turns;
    ctx.progress(&format!(
        "loop on {}: up to {max} turn(s); between decisions it waits for work up to {} s \
         (Ctrl-C stops after the current turn)",
        req.turn.goal_id, req.max_sleep_seconds
    ));
    let quiet = ctx.verbosity == super::Verbosity::Quiet;
    // Progress goes to stderr so `--format json` keeps stdout parseable.
    let report = run_loop(&mut kernel, &req, |event| match event {
        LoopEvent::Turn { n, outcome: o, .. } => {
            if quiet {
                return;
            }
            let mut err = std::io::stderr().lock();
            // The line carries the turn's detail, which may quote the host's output: shown inert.
            let _ = writeln!(
                err,
                "turn {n}/{max} {} {}",
                crate::inert::line(&o.short_line()),
                crate::inert::line(o.turn_key.as_deref().unwrap_or(""))
            );
        }
        // Terminal only, never with -q (`progress`); the reason may name todo titles: inert.
        LoopEvent::Wait {
            disposition,
            reason,
            seconds,
        } => ctx.progress(&wait_line(disposition, reason, seconds)),
    })?;
    let rows = report
        .turns
        .iter()
        .enumerate()
        .map(|(i, o)| {
            vec![
                (i + 1).to_string(),
                opt(&o.todo_id),
                opt(&o.kind),
                format!("{:.1}s", o.elapsed_ms as f64 / 1000.0),
                opt(&o.turn_key),
            ]
        })
        .collect();
    let by_kind = report.turns.iter().fold(
        std::collections::BTreeMap::<String, usize>::new(),
        |mut m, o| {
            *m.entry(opt(&o.kind)).or_default() += 1;
            m
        },
    );
    let out = Output::new(json!({ "loop": report }))
        .heading(format!(
            "Loop of {} on {}: {} turn(s), stopped: {}",
            report.agent_id,
            report.goal_id,
            report.turns.len(),
            report.final_disposition
        ))
        .fields([
            ("reason", report.stop_reason.clone()),
            ("final route", report.final_route.to_string()),
            (
                "results",
                by_kind
                    .iter()
                    .map(|(k, n)| format!("{k}={n}"))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            ("interrupted", report.interrupted.to_string()),
            (
                "elapsed",
                format!("{:.1}s", report.elapsed_ms as f64 / 1000.0),
            ),
            ("recovered turns", recovered(&report.recovered_turns)),
        ])
        .table(&["#", "todo", "kind", "time", "turn"], rows);
    Ok(with_warnings(out, &report.warnings))
}

/// The report's warnings (each once) under its text, as `turn run` lists a turn's.
fn with_warnings(out: Output, warnings: &[String]) -> Output {
    if warnings.is_empty() {
        out
    } else {
        out.list(warnings.to_vec())
    }
}

/// The turns of dead drivers a loop settled while it waited, for its text report.
fn recovered(keys: &[String]) -> String {
    if keys.is_empty() {
        "-".to_string()
    } else {
        keys.join(", ")
    }
}

/// The progress line of one wait of a plain `loop`.
fn wait_line(disposition: LoopDisposition, reason: &str, seconds: u64) -> String {
    format!("waiting {seconds} s before the next decision ({disposition}): {reason}")
}

fn heartbeat(ctx: &Context, args: LoopArgs) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    let req = HeartbeatRequest {
        turn: args.turn.request(ctx)?,
        once: args.once,
        max_turns: args.max_turns,
        max_sleep_seconds: args.max_sleep_seconds.unwrap_or(3600),
        max_consecutive_failures: args.max_consecutive_failures,
        max_unvalidated_turns: args.max_unvalidated_turns,
    };
    install_stop_handlers();
    let project = kernel.paths().project.clone();
    let mut probe = |_: &mut crate::kernel::Kernel, spec: &ProbeSpec| call_probe(&project, spec);
    if !req.once {
        ctx.progress(&format!(
            "loop --watch on {}: runs due checks and ready work, and between them waits for a \
             commit or the next due time (Ctrl-C stops)",
            req.turn.goal_id
        ));
    }
    let quiet = ctx.verbosity == super::Verbosity::Quiet;
    let report = run_heartbeat(&mut kernel, &req, &mut probe, |line| {
        if !quiet {
            let _ = writeln!(std::io::stderr().lock(), "{line}");
        }
    })?;
    let rows = report
        .checks
        .iter()
        .map(|c| {
            vec![
                c.todo_id.clone(),
                c.check_seq.to_string(),
                c.result.clone(),
                opt(&c.follow_up_todo),
                opt(&c.detail),
            ]
        })
        .collect();
    let out = Output::new(json!({ "heartbeat": report }))
        .heading(format!(
            "Heartbeat of {} on {}: {} tick(s), {} check(s), {} turn(s)",
            report.agent_id,
            report.goal_id,
            report.ticks,
            report.checks.len(),
            report.turns.len()
        ))
        .fields([
            ("stopped", report.stop_reason.clone()),
            ("final route", report.final_route.to_string()),
            ("ended monitors", report.ended_monitors.join(", ")),
            ("resumed todos", report.resumed_todos.join(", ")),
            ("recovered turns", recovered(&report.recovered_turns)),
            (
                "goal probe runs",
                report
                    .probe_runs
                    .iter()
                    .map(|r| format!("{} (revision {})", r.result, r.revision))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("interrupted", report.interrupted.to_string()),
        ])
        .table(&["monitor", "check", "result", "follow-up", "detail"], rows);
    Ok(with_warnings(out, &report.warnings))
}
