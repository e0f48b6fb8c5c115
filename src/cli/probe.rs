//! `loopx probe set|show|run`: the goal's next-probe note (text, never executed) and its provider
//! probe (a provider operation, run by `probe run` and by the heartbeat once per revision).

use clap::Subcommand;
use serde_json::{Value, json};

use super::output::Output;
use super::{Command, Context, Nested, WasmDispatch, opt};
use crate::error::Result;
use crate::kernel::projection::goal_probe_json;
use crate::model::{Goal, GoalProbe, ProbeSpec};
use crate::turn::probe_call::{call_probe, run_goal_probe};

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ProbeCommand {
    /// Store the next-probe note, set the provider probe, or clear both with --clear.
    Set {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// A note: a check to run next, stored as text and shown, never executed.
        #[arg(long, required_unless_present_any = ["clear", "provider"], value_parser = super::flags::probe_text)]
        text: Option<String>,
        /// The provider probe's provider, `<extension>/<provider>` (e.g. fs-observe/fs): run
        /// with the provider's grants (read-only grants only) by `probe run` and by the heartbeat.
        #[arg(long, requires_all = ["operation", "target"])]
        provider: Option<String>,
        /// The provider operation (e.g. metric).
        #[arg(long, requires = "provider")]
        operation: Option<String>,
        /// What the operation reads (e.g. a path under the provider's granted directory).
        #[arg(long, requires = "provider", allow_hyphen_values = true)]
        target: Option<String>,
        /// Remove the note and the provider probe.
        #[arg(long, conflicts_with_all = ["text", "provider"])]
        clear: bool,
    },
    /// Show the note and the provider probe with its last outcome.
    Show {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
    /// Run the goal's provider probe now and record its outcome (a failure with its reason).
    /// A goal with only a note is refused (exit 1): a note is never executed.
    Run {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
}

/// `probe set` and `probe show` here; `probe run` starts a provider call, so it runs in the
/// binary that hosts the engine (`wasm`; see [`run_now`]), which keeps process spawning out of
/// the statically linked kernel binary.
pub fn run(ctx: &Context, cmd: ProbeCommand, wasm: WasmDispatch) -> Result<Output> {
    match cmd {
        ProbeCommand::Set {
            goal_id,
            text,
            provider,
            operation,
            target,
            ..
        } => {
            let mut kernel = ctx.kernel()?;
            let actor = ctx.operator_or_agent();
            let (goal, probe) = match (provider, operation, target) {
                (Some(provider), Some(operation), Some(target)) => {
                    let spec = ProbeSpec {
                        provider,
                        operation,
                        target,
                    };
                    let (goal, probe) = kernel.set_provider_probe(&actor, &goal_id, spec, text)?;
                    (goal, Some(probe))
                }
                _ => {
                    let goal = kernel.set_probe(&actor, &goal_id, text)?;
                    let probe = kernel.goal_probe(&goal_id)?;
                    (goal, probe)
                }
            };
            Ok(show(&goal, probe.as_ref()))
        }
        ProbeCommand::Show { goal_id } => {
            let kernel = ctx.kernel()?;
            let goal = kernel.goal(&goal_id)?;
            let probe = kernel.goal_probe(&goal_id)?;
            Ok(show(&goal, probe.as_ref()))
        }
        ProbeCommand::Run { .. } => wasm(ctx, Command::Probe(Nested { command: cmd })),
    }
}

/// `probe run`: claims a run of the goal's provider probe, calls the provider in a child process
/// (its grants and limits) and records the outcome; a goal with only a note is refused (exit 1).
pub fn run_now(ctx: &Context, goal_id: &str) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    let actor = ctx.operator_or_agent();
    let project = kernel.paths().project.clone();
    let holder = format!("probe-run.pid{}", std::process::id());
    let mut call = |_: &mut crate::kernel::Kernel, spec: &ProbeSpec| call_probe(&project, spec);
    let report = run_goal_probe(&mut kernel, &actor, goal_id, &holder, false, &mut call)?
        .ok_or_else(|| {
            crate::error::conflict(format!(
                "another run of the provider probe of goal '{goal_id}' was claimed while \
                 this one ran; its result stands"
            ))
        })?;
    let goal = kernel.goal(goal_id)?;
    let mut out = show(&goal, Some(&report.probe));
    out.value["run"] = json!({
        "run_seq": report.probe.run_seq,
        "result": report.result,
        "digest": report.digest,
        "failure": report.probe.last_failure,
    });
    Ok(out
        .heading(format!(
            "Run {} of the provider probe of {}: {}",
            report.probe.run_seq, goal.id, report.result
        ))
        .fields([("failure", opt(&report.probe.last_failure))]))
}

/// The note and the provider probe, as `probe show` prints them (also after `set` and `run`).
fn show(goal: &Goal, probe: Option<&GoalProbe>) -> Output {
    let probe_value = probe.map(goal_probe_json).unwrap_or(Value::Null);
    let mut out = Output::new(json!({
        "goal_id": goal.id,
        "next_probe": goal.next_probe,
        "executed": false,
        "provider_probe": probe_value,
    }))
    .heading(format!("Next probe of {}", goal.id))
    .fields([
        ("note", opt(&goal.next_probe)),
        (
            "note is",
            "stored and shown; LoopX never executes it".to_string(),
        ),
    ]);
    out = match probe {
        None => out.fields([("provider probe", "none".to_string())]),
        Some(p) => out.fields(probe_fields(p)),
    };
    out
}

/// The provider probe's lines in text output (`probe show`, `goal show`).
pub(crate) fn probe_fields(p: &GoalProbe) -> Vec<(&'static str, String)> {
    vec![
        (
            "provider probe",
            format!("{} {} {}", p.spec.provider, p.spec.operation, p.spec.target),
        ),
        (
            "revision",
            format!(
                "{}{}",
                p.revision,
                if p.pending() { " (not run yet)" } else { "" }
            ),
        ),
        (
            "last run",
            match (p.last_result, p.last_checked_at) {
                (Some(r), Some(at)) => format!("{r} at {}", crate::clock::rfc3339(at)),
                _ => "never".to_string(),
            },
        ),
        ("last digest", opt(&p.last_digest)),
        ("last failure", opt(&p.last_failure)),
        ("last observation", opt(&p.last_observation)),
    ]
}
