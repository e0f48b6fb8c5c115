//! Running one turn: recover the goal's orphans, decide, start, and drive the phases.
//!
//! Why this exists: it is the entry point (`turn run`, `loop`, `runtime::run_turn`) that puts the
//! pieces in order. A named turn key replays a settled turn or resumes an unsettled one; otherwise
//! the goal's orphaned turns are settled first, the turn is started through the kernel (decision,
//! claim and journal row in one transaction, `Kernel::start_turn`) with the journal's first `data`
//! built here, and `phases::advance` drives the phases. The journal row is the whole truth about a turn
//! (`journal`), every phase commits through the kernel with its state effects (`commit`), and a
//! process that drives a turn holds its lock (`lock`), so a crash anywhere is finished by
//! `recovery`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::{Value, json};

use super::JournalStatus;
use super::capability::BUILTIN;
use super::commit::turn_actor;
use super::isolation::{self, Isolation};
use super::journal::{ClaimInfo, JOURNAL_SCHEMA, JournalData};
use super::lock::{TurnLock, crash_hook};
use super::outcome::{TurnOutcome, stored_outcome};
use super::phases::advance;
use super::recovery::{recover_one, settle_orphans};
use super::request::{LEASE_MARGIN_SECONDS, TurnRequest, check_request};
use super::result::REQUEST_SCHEMA;
use crate::clock::{now_ms, rfc3339};
use crate::error::{Result, conflict};
use crate::ids::new_ulid;
use crate::kernel::Kernel;
use crate::kernel::claim::MAX_TTL_SECONDS;
use crate::kernel::turn_journal::{StartTurn, TurnGrant, TurnStart};
use crate::model::TurnRecord;

/// Runs one turn: settles the goal's orphaned turns (any agent's, whose driver is gone), decides,
/// and (when the route is `ready_for_host`) claims, runs the host and settles every phase.
pub fn run_turn(kernel: &mut Kernel, req: &TurnRequest) -> Result<TurnOutcome> {
    check_request(req)?;
    let started = Instant::now();
    if let Some(key) = &req.turn_key
        && let Some(rec) = kernel.turn(key)?
    {
        return replay_or_resume(kernel, req, key, &rec);
    }
    let recovered_turns = settle_orphans(kernel, &req.goal_id)?;
    let turn_key = req
        .turn_key
        .clone()
        .unwrap_or_else(|| format!("turn-{}", new_ulid()));
    // `--isolation required` on a machine that cannot isolate is refused before anything is
    // claimed; `auto` there runs unisolated and says so.
    let (sandbox, isolation_warning) = isolation::resolve(req.isolation, &kernel.paths().state)?;
    let isolation = match sandbox {
        Some(_) => Isolation::Namespace,
        None => Isolation::None,
    };
    let Some(lock) = TurnLock::try_acquire(kernel, &turn_key)? else {
        return Err(conflict(format!(
            "turn '{turn_key}' is locked by another process"
        )));
    };
    let cwd = crate::paths::working_directory()?;
    let launch = Launch {
        host_argv: absolutize(&cwd, &req.host_argv),
        validate_argv: req.validate_argv.as_deref().map(|v| absolutize(&cwd, v)),
        project_root: kernel.paths().project.clone(),
        cwd,
        turn_key,
        isolation,
        started_ms: now_ms(),
        clock: Instant::now(),
    };
    let start = StartTurn {
        turn_key: launch.turn_key.clone(),
        goal_id: req.goal_id.clone(),
        agent_id: req.agent_id.clone(),
        todo_id: req.todo_id.clone(),
        ttl_seconds: (req.timeout_seconds + LEASE_MARGIN_SECONDS).min(MAX_TTL_SECONDS),
    };
    let actor = turn_actor(&req.agent_id, &launch.turn_key);
    // The journal data is built inside the start transaction (it needs the granted claim) and
    // kept here in its typed form, so the phases do not decode what was just encoded.
    let mut journal: Option<JournalData> = None;
    let start = kernel.start_turn(&actor, &start, |grant| {
        let data = initial_journal(req, &launch, grant);
        let value = serde_json::to_value(&data).expect("journal data serializes");
        journal = Some(data);
        Ok(value)
    })?;
    let (mut rec, mut data) = match (start, journal) {
        (TurnStart::Started(rec), Some(data)) => (rec, data),
        (TurnStart::Started(_), None) => unreachable!("a started turn built its journal"),
        (TurnStart::NotReady(decision), _) => {
            lock.finish();
            return Ok(TurnOutcome::not_ready(
                &decision,
                recovered_turns,
                started.elapsed().as_millis() as u64,
            ));
        }
    };
    crash_hook("start");
    let warnings = advance(kernel, &mut rec, &mut data, true)?;
    lock.finish();
    let mut o = TurnOutcome::from_journal(&rec, &data);
    o.recovered_turns = recovered_turns;
    o.warnings = warnings;
    o.warnings.extend(isolation_warning);
    o.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(o)
}

/// A turn key that is already in the journal: a settled turn's stored outcome (no effects), or
/// the recovery of an unsettled one, unless another process is still driving it.
fn replay_or_resume(
    kernel: &mut Kernel,
    req: &TurnRequest,
    key: &str,
    rec: &TurnRecord,
) -> Result<TurnOutcome> {
    if rec.goal_id != req.goal_id || rec.agent_id != req.agent_id {
        return Err(conflict(format!(
            "turn key '{key}' belongs to goal '{}' and agent '{}'; pick a new key",
            rec.goal_id, rec.agent_id
        )));
    }
    if rec.status != JournalStatus::InProgress {
        return stored_outcome(kernel, key);
    }
    recover_one(kernel, key)?.ok_or_else(|| {
        conflict(format!(
            "turn '{key}' is in flight in another process; `loopx turn inspect --turn-key {key}` shows it"
        ))
    })
}

/// What this process fixed about a turn before starting it.
struct Launch {
    turn_key: String,
    host_argv: Vec<String>,
    validate_argv: Option<Vec<String>>,
    /// Where `loopx` was started: the host's directory when the goal names none that exists.
    cwd: PathBuf,
    project_root: PathBuf,
    isolation: Isolation,
    started_ms: i64,
    /// Measures the start step (`timings_us.start`).
    clock: Instant,
}

/// A relative program path (`./host.sh`) means relative to where `loopx` was started, not to the
/// goal's project directory the host runs in.
fn absolutize(cwd: &Path, argv: &[String]) -> Vec<String> {
    let mut argv = argv.to_vec();
    if argv[0].contains('/') && !argv[0].starts_with('/') {
        argv[0] = cwd.join(&argv[0]).to_string_lossy().into_owned();
    }
    argv
}

/// The journal of a turn just granted its claim: the request the host will read, how to run it,
/// and no phase yet.
fn initial_journal(req: &TurnRequest, launch: &Launch, grant: &TurnGrant) -> JournalData {
    let capability = req
        .capability
        .clone()
        .or_else(|| grant.todo.capability.clone())
        .unwrap_or_else(|| BUILTIN.to_string());
    let host_cwd = grant
        .goal
        .project_dir
        .as_ref()
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(|| launch.cwd.clone());
    let claim = ClaimInfo {
        fence: grant.claim.fence,
        claim_key: grant.claim.idempotency_key.clone(),
        expires_at: grant.claim.expires_at,
    };
    let request = host_request(req, &launch.turn_key, grant, &capability, &claim);
    let mut data = JournalData {
        schema_version: JOURNAL_SCHEMA.to_string(),
        request,
        host_argv: launch.host_argv.clone(),
        validate_argv: launch.validate_argv.clone(),
        timeout_ms: req.timeout_seconds * 1000,
        trust_host_completion: req.trust_host_completion,
        capability,
        cwd: host_cwd.to_string_lossy().into_owned(),
        project_root: launch.project_root.to_string_lossy().into_owned(),
        claim,
        route_reason: grant.decision.reason.clone(),
        host: None,
        result: None,
        result_error: None,
        validation: None,
        writeback: None,
        spend: None,
        lease: None,
        kind: None,
        failed_phase: None,
        failure: None,
        run_id: None,
        recovered: false,
        orphans_killed: Vec::new(),
        timings_us: std::collections::BTreeMap::new(),
        driver_pid: std::process::id(),
        started_at: launch.started_ms,
        settled_at: None,
        isolation: launch.isolation,
    };
    data.timings_us.insert(
        "start".to_string(),
        launch.clock.elapsed().as_micros() as u64,
    );
    data
}

/// The `loopx.turn_request.v1` document the host reads on stdin, as the journal keeps it: without
/// `result_schema`, the same constant text for every turn of this binary, which
/// [`super::result::host_stdin`] adds when the host is started (about a kilobyte per turn the journal need not
/// hold).
fn host_request(
    req: &TurnRequest,
    turn_key: &str,
    grant: &TurnGrant,
    capability: &str,
    claim: &ClaimInfo,
) -> Value {
    let (goal, todo) = (grant.goal, grant.todo);
    json!({
        "schema_version": REQUEST_SCHEMA,
        "turn_key": turn_key,
        "goal": {
            "id": goal.id,
            "title": goal.title,
            "objective": goal.objective,
            "success_criteria": goal.success_criteria,
            "project_dir": goal.project_dir,
        },
        "todo": {
            "id": todo.id,
            "title": todo.title,
            "detail": todo.detail,
            "priority": todo.priority,
            "lane": todo.lane,
            "capability": capability,
        },
        "agent_id": req.agent_id,
        "claim": {
            "fence": claim.fence,
            "claim_key": claim.claim_key,
            "expires_at": rfc3339(claim.expires_at),
        },
        "deadline_seconds": req.timeout_seconds,
        "validator": req.validate_argv.is_some(),
    })
}

/// Rewrites the goal's `state.json` / `STATE.md` projections. The driver itself does not (they
/// are projections, re-created by any `refresh-state`); `loopx turn run` calls this after every
/// turn and `loopx loop` at most every [`PROJECTION_INTERVAL_MS`] and when it stops. Returns a
/// warning instead of failing: a turn that settled is not undone by a projection error.
pub fn refresh_projection(kernel: &mut Kernel, goal_id: &str) -> Option<String> {
    kernel
        .write_goal_projection(goal_id)
        .err()
        .map(|e| format!("goal projection: {e}"))
}

/// How often `loopx loop` re-projects the goal state while it runs.
pub const PROJECTION_INTERVAL_MS: i64 = 2_000;
