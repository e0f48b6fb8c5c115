//! `loopx capability invoke`: run a capability on a goal and show the kernel's verdict on each
//! proposal. With `--dry-run` admission runs its checks and rolls back: nothing is written.
//!
//! A sandbox failure (deadline, fuel, memory, oversize output, trap, ...) is reported with the
//! plugin's captured log on stderr and never reaches admission.

use std::path::PathBuf;

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::{LoopxError, Result};
use crate::plugin::invoke::{InvokeError, invoke_capability};
use crate::plugin::logs::LogLine;
use crate::plugin::registry::PluginHost;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum CapabilityCommand {
    /// Run CAP (`<extension>/<capability>`) on a goal and admit its proposals.
    Invoke {
        /// `<extension>/<capability>`.
        cap: String,
        /// The goal the capability observes and proposes for.
        #[arg(long)]
        goal_id: String,
        /// The agent on whose behalf it runs (admission checks leases against it).
        #[arg(long)]
        agent_id: Option<String>,
        /// Payload file handed to `propose` (`-` reads stdin).
        #[arg(long, value_name = "FILE", value_parser = super::flags::path)]
        input: PathBuf,
        /// Check every proposal against current state, write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Reads `--input FILE` (or stdin for `-`), bounded.
pub(crate) fn read_input(ctx: &Context, path: &std::path::Path) -> Result<String> {
    use std::io::Read;
    const MAX: u64 = crate::plugin::sandbox::MAX_PAYLOAD_BYTES as u64;
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin().take(MAX + 1).read_to_string(&mut text)
    } else {
        let p = ctx.absolute(path)?;
        std::fs::File::open(&p).and_then(|f| f.take(MAX + 1).read_to_string(&mut text))
    };
    read.map_err(|e| {
        let what = format!("cannot read --input {}: {e}", path.display());
        match e.kind() {
            std::io::ErrorKind::NotFound => {
                crate::error::not_found(format!("{what}; pass an existing file, or - for stdin"))
            }
            _ if crate::error::is_environmental(&e) => {
                crate::error::LoopxError::io(path, format!("reading --input {}", path.display()), e)
            }
            // Not UTF-8, or a directory: the input itself is wrong.
            _ => crate::error::bad_input(what),
        }
    })?;
    if text.len() as u64 > MAX {
        return Err(crate::error::bad_input(format!(
            "--input {} is larger than {MAX} bytes",
            path.display()
        )));
    }
    Ok(text)
}

/// Prints captured plugin log lines to stderr, inert (capture strips escape sequences, but not
/// bidi controls or invisible characters).
/// Written, not `eprintln!`ed: a stderr that fails (a full disk, a reader gone) loses the logs
/// instead of panicking the command (exit 101) after its work is done.
pub(crate) fn print_logs(logs: &[LogLine]) {
    use std::io::Write;

    use crate::inert::line;
    let mut err = std::io::stderr().lock();
    for l in logs {
        let _ = writeln!(
            err,
            "[{} {}] {}",
            line(&l.plugin),
            line(&l.stream),
            line(&l.text)
        );
    }
}

pub(crate) fn fail(e: InvokeError) -> LoopxError {
    if let Some(call) = &e.call {
        print_logs(&call.logs);
    }
    e.error
}

pub fn run(ctx: &Context, cmd: CapabilityCommand) -> Result<Output> {
    match cmd {
        CapabilityCommand::Invoke {
            cap,
            goal_id,
            agent_id,
            input,
            dry_run,
        } => {
            let payload = read_input(ctx, &input)?;
            let agent = agent_id.or_else(|| ctx.env_agent_id.clone());
            let mut kernel = ctx.kernel()?;
            let host = PluginHost::for_project(kernel.paths());
            let out = invoke_capability(
                &mut kernel,
                &host,
                &cap,
                &goal_id,
                agent.as_deref(),
                payload,
                dry_run,
            )
            .map_err(fail)?;
            let a = &out.admission;
            let rows = out
                .proposals
                .iter()
                .zip(&a.verdicts)
                .map(|(p, v)| {
                    vec![
                        v.index.to_string(),
                        p.kind().to_string(),
                        if v.accepted { "accepted" } else { "refused" }.to_string(),
                        v.todo_id.clone().unwrap_or_else(|| "-".into()),
                        v.reason.clone(),
                    ]
                })
                .collect();
            let mut o = Output::new(json!({
                "capability": out.capability,
                "goal_id": out.goal_id,
                "agent_id": out.agent_id,
                "dry_run": dry_run,
                "proposals": out.proposals,
                "admission": a,
                "call": out.call,
            }))
            .heading(format!(
                "{} on {}: {} proposal(s), {} accepted, {} refused{}",
                out.capability,
                out.goal_id,
                out.proposals.len(),
                a.accepted,
                a.refused,
                if dry_run {
                    " (dry run: nothing written)"
                } else {
                    ""
                }
            ))
            .table(&["#", "proposal", "verdict", "todo", "reason"], rows)
            .fields([
                ("run", a.run_id.clone().unwrap_or_else(|| "-".into())),
                (
                    "fuel",
                    out.call
                        .fuel_consumed
                        .map(|f| f.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
                ("elapsed", format!("{} µs", out.call.elapsed_us)),
            ]);
            if !out.call.provider_calls.is_empty() {
                o = o.heading("Provider calls").table(
                    &["provider", "operation", "target", "outcome"],
                    out.call
                        .provider_calls
                        .iter()
                        .map(|c| {
                            vec![
                                c.provider.clone(),
                                c.operation.clone(),
                                c.target.clone(),
                                c.outcome.clone(),
                            ]
                        })
                        .collect(),
                );
            }
            if !out.call.logs.is_empty() {
                o = o.heading("Plugin log").list(
                    out.call
                        .logs
                        .iter()
                        .map(|l| format!("[{} {}] {}", l.plugin, l.stream, l.text))
                        .collect(),
                );
            }
            Ok(o)
        }
    }
}
