//! Provider probes run from outside the engine: the one child-process provider call that the
//! heartbeat's provider-backed monitor checks and a goal's provider probe (`probe run`, and the
//! heartbeat once per revision) share, and the claim-call-record sequence of a goal probe.
//!
//! The call is `loopx-wasm provider call` in a child process, with the provider's granted
//! permissions and limits. A child, not this process: the engine's epoch ticker wakes its process
//! every few milliseconds for as long as the engine lives, and a heartbeat must cost nothing while
//! it sleeps; the kernel binary (`probe run`) links no engine at all (docs/decisions.md).

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::error::Result;
use crate::kernel::goal::GoalProbeReport;
use crate::kernel::monitor::Observation;
use crate::kernel::{Actor, Kernel};
use crate::model::ProbeSpec;

/// Runs a provider operation: the observation's text, or why there is none. The CLI passes
/// [`call_probe`]; tests and embedders may pass another.
pub type ProbeFn<'a> =
    dyn FnMut(&mut Kernel, &ProbeSpec) -> std::result::Result<String, String> + 'a;

/// Longest a probe's process may run; the provider's own deadline (its manifest's limits,
/// enforced by the plugin host in that process) is far shorter.
const PROBE_PROCESS_LIMIT: Duration = Duration::from_secs(120);

/// The text a probe compares by digest: the observation's facts and body (not its summary, which
/// may carry timing).
fn probe_text(obs: &serde_json::Value) -> String {
    serde_json::to_string(&json!({"kind": obs["kind"], "facts": obs["facts"], "body": obs["body"]}))
        .unwrap_or_default()
}

/// Runs `spec` as `provider call` of the project at `project` in a child process of this
/// executable (`loopx` execs `loopx-wasm` for it). A failure, a timeout, a disabled or missing
/// provider is the `Err` reason, never a panic.
pub fn call_probe(project: &Path, spec: &ProbeSpec) -> std::result::Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating loopx-wasm: {e}"))?;
    let request = json!({"operation": spec.operation, "target": spec.target, "params": {}});
    let mut child = std::process::Command::new(exe)
        .arg("--root")
        .arg(project)
        .args([
            "--format",
            "json",
            "provider",
            "call",
            &spec.provider,
            "--input",
            "-",
        ])
        .env_remove("LOOPX_TURN_KEY")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the probe process: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(request.to_string().as_bytes());
    }
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > PROBE_PROCESS_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "provider {} timed out after {} s",
                    spec.provider,
                    PROBE_PROCESS_LIMIT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for the probe process: {e}")),
        }
    };
    let (mut out, mut err) = (Vec::new(), String::new());
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut out);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_string(&mut err);
    }
    if !status.success() {
        let reason: String = err.trim().chars().take(1000).collect();
        return Err(format!("provider {} failed: {reason}", spec.provider));
    }
    let value: serde_json::Value = serde_json::from_slice(&out)
        .map_err(|e| format!("provider {} printed no observation: {e}", spec.provider))?;
    Ok(probe_text(&value["observation"]))
}

/// Claims a run of the goal's provider probe, runs it through `call` and records its outcome
/// (a failure with its reason). With `pending_only` (the heartbeat) it runs only a revision not
/// run yet and returns `None` otherwise, or when an overlapping claim superseded this run.
pub fn run_goal_probe(
    kernel: &mut Kernel,
    actor: &Actor,
    goal_id: &str,
    holder: &str,
    pending_only: bool,
    call: &mut ProbeFn<'_>,
) -> Result<Option<GoalProbeReport>> {
    let Some(ticket) = kernel.claim_goal_probe(goal_id, holder, pending_only)? else {
        return Ok(None);
    };
    let observation = match &ticket.refusal {
        Some(why) => Observation::Failed(why.clone()),
        None => match call(kernel, &ticket.spec) {
            Ok(text) => Observation::Value(text),
            Err(reason) => Observation::Failed(reason),
        },
    };
    match kernel.record_goal_probe(actor, &ticket, &observation) {
        Ok(report) => Ok(Some(report)),
        // Another run claimed it since, or the probe was cleared: that run's result stands.
        Err(e) if pending_only && e.exit_code() == 4 => Ok(None),
        Err(e) => Err(e),
    }
}
