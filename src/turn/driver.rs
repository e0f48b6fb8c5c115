//! The turn driver: plan, run, recover and inspect turns.
//!
//! The journal row (`turns` table, one per turn key) is the whole truth about a turn: its request,
//! the host's captured outcome, the parsed result, the validation verdict, the admitted proposals,
//! the spend and the closeout. [`advance`] looks only at that row to pick the next phase, so the
//! same code runs a fresh turn and finishes an interrupted one. Each phase commits its journal
//! update in the same transaction as its state effects (admission and run row with
//! `durable_writeback`, the ledger row with `quota_spend`, the lease release with
//! `terminal_closeout`), and every commit first checks that the row still has the phases this
//! process last saw (a compare-and-swap), so two recoverers can never both apply a phase.
//!
//! A process that drives or recovers a turn holds an exclusive `flock` on
//! `.loopx/turns/<turn-key>.lock`; the kernel drops it when the process dies (even by SIGKILL), so
//! `turn recover` skips turns whose driver is still alive and takes over only orphaned ones.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::capability::{BUILTIN, builtin_proposals, capability_payload, wasm_proposals};
use super::channel::{ChannelServer, SOCKET_ENV, TurnIdentity};
use super::host::{ProcessOutcome, ProcessSpec, kill_turn_processes, run_process};
use super::isolation::{self, Isolation, IsolationMode, Sandbox};
use super::result::{
    HostResult, HostStatus, MAX_STDERR_TAIL, MAX_STDOUT, REQUEST_SCHEMA, parse_result,
    result_schema_hint,
};
use super::{JournalStatus, Phase, TurnResultKind};
use crate::clock::{now_ms, rfc3339};
use crate::error::{LoopxError, Result, bad_input, conflict, not_found};
use crate::ids::{new_ulid, validate_token};
use crate::kernel::claim::MAX_TTL_SECONDS;
use crate::kernel::decision::{Decision, TurnRoute};
use crate::kernel::todo::check_capability_name;
use crate::kernel::transition::{ProposalSource, Transition, Verdict};
use crate::kernel::turn_journal::{
    EffectOutcome, LeaseHeld, LeaseOutcome, PhaseEffect, PhaseWrite, StartTurn, TurnStart,
};
use crate::kernel::{Actor, Kernel};
use crate::model::TurnRecord;
use crate::model::{Run, TodoStatus};

pub const JOURNAL_SCHEMA: &str = "loopx.turn_journal.v1";
pub const OUTCOME_SCHEMA: &str = "loopx.turn_outcome.v1";
/// Host budget when none is given.
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 1800;
pub const MAX_TIMEOUT_SECONDS: u64 = 24 * 3600;
/// The lease outlives the host budget by this much, so it cannot expire under a running host.
pub const LEASE_MARGIN_SECONDS: u64 = 300;
/// Env var naming a phase after whose commit the driver SIGKILLs itself. Test-only.
pub const CRASH_HOOK_ENV: &str = "LOOPX_TEST_CRASH_AFTER";
const MAX_ARGV_ITEMS: usize = 64;
const MAX_ARG_LEN: usize = 4096;

/// What to run: one turn of `agent_id` on `goal_id`.
#[derive(Debug, Clone)]
pub struct TurnRequest {
    pub goal_id: String,
    pub agent_id: String,
    /// A specific todo; default: the decision's selected todo.
    pub todo_id: Option<String>,
    /// The host argv (no shell).
    pub host_argv: Vec<String>,
    /// The validator argv (no shell); exit 0 = the result is proven.
    pub validate_argv: Option<Vec<String>>,
    pub timeout_seconds: u64,
    /// Without a validator, accept a host's `completed` claim as a completion.
    pub trust_host_completion: bool,
    /// Overrides the todo's capability.
    pub capability: Option<String>,
    /// Names the turn: a settled key replays its stored result; an in-progress key is resumed;
    /// an unused key is used for the new turn.
    pub turn_key: Option<String>,
    /// Whether the host and validator run in namespaces without `.loopx/`.
    pub isolation: IsolationMode,
}

impl TurnRequest {
    pub fn new(goal_id: &str, agent_id: &str, host_argv: Vec<String>) -> TurnRequest {
        TurnRequest {
            goal_id: goal_id.to_string(),
            agent_id: agent_id.to_string(),
            todo_id: None,
            host_argv,
            validate_argv: None,
            timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
            trust_host_completion: false,
            capability: None,
            turn_key: None,
            isolation: IsolationMode::Auto,
        }
    }
}

/// The lease the turn holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimInfo {
    pub fence: i64,
    pub claim_key: String,
    pub expires_at: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ValidationRecord {
    /// A validator process ran.
    pub ran: bool,
    pub passed: bool,
    /// The host claimed `completed` and the claim stands (validator passed, or trusted).
    pub completion_validated: bool,
    pub detail: String,
    pub validator: Option<ProcessOutcome>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WritebackRecord {
    pub capability: String,
    pub proposals: Vec<Transition>,
    pub verdicts: Vec<Verdict>,
    pub accepted: usize,
    pub refused: usize,
    pub error: Option<String>,
    pub todo_status_after: Option<TodoStatus>,
    /// The plugin host's call report (WebAssembly capabilities only).
    pub call: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpendRecord {
    pub effect_id: String,
    pub slots: i64,
    pub idempotent_replay: bool,
}

/// Everything the driver needs to resume a turn; stored as the journal row's `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalData {
    pub schema_version: String,
    /// The request JSON the host received on stdin.
    pub request: Value,
    pub host_argv: Vec<String>,
    pub validate_argv: Option<Vec<String>>,
    pub timeout_ms: u64,
    pub trust_host_completion: bool,
    pub capability: String,
    pub cwd: String,
    pub project_root: String,
    pub claim: ClaimInfo,
    pub route_reason: String,
    pub host: Option<ProcessOutcome>,
    pub result: Option<HostResult>,
    pub result_error: Option<String>,
    pub validation: Option<ValidationRecord>,
    pub writeback: Option<WritebackRecord>,
    pub spend: Option<SpendRecord>,
    /// `released`, `cleared` (completion or block cleared it), `not_held` (taken over after
    /// expiry), or `not_released: <why>`.
    pub lease: Option<String>,
    pub kind: Option<TurnResultKind>,
    pub failed_phase: Option<Phase>,
    pub failure: Option<String>,
    pub run_id: Option<String>,
    /// Set when a process other than the original driver finished the turn.
    pub recovered: bool,
    /// Processes of this turn that recovery found still running and killed.
    #[serde(default)]
    pub orphans_killed: Vec<i32>,
    /// Microseconds each step spent before its commit (work and transaction body; the commit's
    /// own fsync is not included): `start` (decide + claim), then one entry per phase.
    #[serde(default)]
    pub timings_us: std::collections::BTreeMap<String, u64>,
    pub driver_pid: u32,
    pub started_at: i64,
    pub settled_at: Option<i64>,
    /// How the host and validator run: in namespaces without `.loopx/`, or not isolated. A
    /// validator that recovery runs later runs the same way (or not at all).
    #[serde(default)]
    pub isolation: Isolation,
}

/// How a `turn run` (or one recovered turn) ended.
#[derive(Debug, Clone, Serialize)]
pub struct TurnOutcome {
    pub schema_version: &'static str,
    pub goal_id: String,
    pub agent_id: String,
    /// The route decided before the host (`ready_for_host` for every turn that ran).
    pub route: TurnRoute,
    pub reason: String,
    pub turn_key: Option<String>,
    pub todo_id: Option<String>,
    pub kind: Option<TurnResultKind>,
    pub status: Option<JournalStatus>,
    pub phases: Vec<Phase>,
    pub failed_phase: Option<Phase>,
    /// The host's summary, or what failed.
    pub detail: String,
    pub run_id: Option<String>,
    pub spent: bool,
    pub lease: Option<String>,
    /// A settled turn key was given: its stored result, no effects.
    pub replayed: bool,
    /// Finished by recovery rather than by the driver that started it.
    pub recovered: bool,
    /// Turns of this goal/agent that were settled before this one started.
    pub recovered_turns: Vec<String>,
    pub next_check_after_seconds: u64,
    pub elapsed_ms: u64,
    pub warnings: Vec<String>,
    /// No turn started because this live turn already works the lease (`turn run` exits 4).
    pub working_turn: Option<String>,
    /// The turn's delivery was proven: a validator ran and passed, or the todo's completion
    /// stands (validated or trusted with `--trust-host-completion`).
    pub validated: bool,
    /// How the host ran: `namespace` (kept out of `.loopx/`) or `none`.
    pub isolation: Isolation,
}

impl TurnOutcome {
    fn not_ready(d: &Decision, recovered_turns: Vec<String>, elapsed_ms: u64) -> TurnOutcome {
        TurnOutcome {
            schema_version: OUTCOME_SCHEMA,
            goal_id: d.goal_id.clone(),
            agent_id: d.agent_id.clone(),
            route: d.route,
            reason: d.reason.clone(),
            turn_key: None,
            todo_id: d.selected_todo.as_ref().map(|s| s.todo.id.clone()),
            kind: None,
            status: None,
            phases: Vec::new(),
            failed_phase: None,
            detail: d.reason.clone(),
            run_id: None,
            spent: false,
            lease: None,
            replayed: false,
            recovered: false,
            recovered_turns,
            next_check_after_seconds: d.next_check_after_seconds,
            elapsed_ms,
            warnings: Vec::new(),
            working_turn: d.working_turn.clone(),
            validated: false,
            isolation: Isolation::None,
        }
    }

    fn from_journal(rec: &TurnRecord, data: &JournalData) -> TurnOutcome {
        let detail = match (&data.failure, &data.result) {
            (Some(f), _) => f.clone(),
            (None, Some(r)) => r.summary.clone(),
            (None, None) => String::new(),
        };
        TurnOutcome {
            schema_version: OUTCOME_SCHEMA,
            goal_id: rec.goal_id.clone(),
            agent_id: rec.agent_id.clone(),
            route: TurnRoute::ReadyForHost,
            reason: data.route_reason.clone(),
            turn_key: Some(rec.turn_key.clone()),
            todo_id: rec.todo_id.clone(),
            kind: data.kind,
            status: Some(rec.status),
            phases: rec.phases.clone(),
            failed_phase: data.failed_phase,
            detail,
            run_id: data.run_id.clone(),
            spent: data.spend.is_some(),
            lease: data.lease.clone(),
            replayed: false,
            recovered: data.recovered,
            recovered_turns: Vec::new(),
            next_check_after_seconds: 0,
            elapsed_ms: data
                .settled_at
                .map(|s| (s - data.started_at).max(0) as u64)
                .unwrap_or(0),
            warnings: Vec::new(),
            working_turn: None,
            validated: data
                .validation
                .as_ref()
                .is_some_and(|v| (v.ran && v.passed) || v.completion_validated),
            isolation: data.isolation,
        }
    }

    /// One line for people: `t4 validated_progress 1.2s`.
    pub fn short_line(&self) -> String {
        let what = match self.kind {
            Some(k) => k.to_string(),
            None => format!("route {}", self.route),
        };
        format!(
            "{} {} {:.1}s",
            self.todo_id.as_deref().unwrap_or("-"),
            what,
            self.elapsed_ms as f64 / 1000.0
        )
    }
}

/// The decision a `turn run` would act on. A pure read.
pub fn plan(kernel: &mut Kernel, goal_id: &str, agent_id: &str) -> Result<Decision> {
    kernel.should_run(goal_id, agent_id)
}

/// The journal row of a turn.
pub fn inspect(kernel: &mut Kernel, turn_key: &str) -> Result<TurnRecord> {
    validate_token("turn key", turn_key)?;
    kernel.turn(turn_key)?.ok_or_else(|| {
        not_found(format!(
            "no turn '{turn_key}' in the journal; turn keys are printed by `loopx turn run`"
        ))
    })
}

/// The newest `limit` turns of the journal, optionally of one goal and one status, newest first.
/// An unknown goal is `NotFound` (exit 3), a limit of 0 `BadInput`.
pub fn list_turns(
    kernel: &mut Kernel,
    goal_id: Option<&str>,
    status: Option<JournalStatus>,
    limit: usize,
) -> Result<Vec<TurnRecord>> {
    if limit == 0 {
        return Err(crate::error::bad_input("--limit must be at least 1"));
    }
    kernel.recent_turns(goal_id, status, limit)
}

/// The stored outcome of a turn (settled or not), without effects.
pub fn stored_outcome(kernel: &mut Kernel, turn_key: &str) -> Result<TurnOutcome> {
    let rec = inspect(kernel, turn_key)?;
    let data = journal_data(&rec)?;
    let mut o = TurnOutcome::from_journal(&rec, &data);
    o.replayed = true;
    Ok(o)
}

fn journal_data(rec: &TurnRecord) -> Result<JournalData> {
    serde_json::from_value(rec.data.clone()).map_err(|e| LoopxError::Corrupt {
        path: PathBuf::from(format!("turns/{}", rec.turn_key)),
        detail: format!("journal data does not parse: {e}"),
    })
}

fn check_argv(what: &str, argv: &[String]) -> Result<()> {
    if argv.is_empty() {
        return Err(bad_input(format!(
            "{what} is empty: name the program to run after `--`"
        )));
    }
    if argv.len() > MAX_ARGV_ITEMS {
        return Err(bad_input(format!(
            "{what} has {} items; the limit is {MAX_ARGV_ITEMS}",
            argv.len()
        )));
    }
    for a in argv {
        if a.len() > MAX_ARG_LEN || a.contains('\0') {
            return Err(bad_input(format!(
                "{what} items must be at most {MAX_ARG_LEN} bytes without NUL"
            )));
        }
    }
    if argv[0].is_empty() {
        return Err(bad_input(format!("{what}[0] is empty")));
    }
    Ok(())
}

/// Checks a turn request before anything is written.
pub fn check_request(req: &TurnRequest) -> Result<()> {
    validate_token("goal id", &req.goal_id)?;
    validate_token("agent id", &req.agent_id)?;
    if let Some(t) = &req.todo_id {
        validate_token("todo id", t)?;
    }
    if let Some(k) = &req.turn_key {
        validate_token("turn key", k)?;
    }
    check_argv("host argv", &req.host_argv)?;
    if let Some(v) = &req.validate_argv {
        check_argv("validator argv", v)?;
    }
    if req.timeout_seconds == 0 || req.timeout_seconds > MAX_TIMEOUT_SECONDS {
        return Err(bad_input(format!(
            "--timeout-seconds {} is out of range: use 1..={MAX_TIMEOUT_SECONDS}",
            req.timeout_seconds
        )));
    }
    if let Some(c) = &req.capability {
        check_capability_name(c)?;
    }
    Ok(())
}

/// Holds `.loopx/turns/<key>.lock` exclusively while a process drives or recovers a turn.
struct TurnLock {
    _file: File,
    path: PathBuf,
}

impl TurnLock {
    fn try_acquire(kernel: &Kernel, turn_key: &str) -> Result<Option<TurnLock>> {
        let dir = kernel.paths().state.join("turns");
        std::fs::create_dir_all(&dir)
            .map_err(|e| LoopxError::internal(format!("creating {}", dir.display()), e))?;
        let path = dir.join(format!("{turn_key}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| LoopxError::internal(format!("opening {}", path.display()), e))?;
        // SAFETY: flock on a file descriptor we own.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(LoopxError::internal(
                format!("locking {}", path.display()),
                err,
            ));
        }
        Ok(Some(TurnLock { _file: file, path }))
    }

    /// This process is done with the turn (settled, or given up on an error): removes the lock
    /// file and releases the lock. A later recoverer creates a fresh file; whatever it finds, it
    /// re-reads the journal under its own lock before acting.
    fn finish(self) {}
}

impl Drop for TurnLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Test-only crash injection: SIGKILL this process right after `phase` committed. Compiled only
/// with the `test-hooks` feature, which the crate's own test builds enable (Cargo.toml).
#[cfg(feature = "test-hooks")]
fn crash_hook(point: &str) {
    if std::env::var(CRASH_HOOK_ENV).is_ok_and(|p| p == point) {
        // SAFETY: plain syscalls; the process ends here.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort();
    }
}

/// Release builds and `cargo build` have no crash hook: the call sites compile to nothing.
#[cfg(not(feature = "test-hooks"))]
fn crash_hook(_point: &str) {}

/// Runs one turn: settles the goal's orphaned turns (any agent's, whose driver is gone), decides,
/// and (when the route
/// is `ready_for_host`) claims, runs the host and settles every phase.
pub fn run_turn(kernel: &mut Kernel, req: &TurnRequest) -> Result<TurnOutcome> {
    check_request(req)?;
    let started = Instant::now();
    if let Some(key) = &req.turn_key
        && let Some(rec) = kernel.turn(key)?
    {
        if rec.goal_id != req.goal_id || rec.agent_id != req.agent_id {
            return Err(conflict(format!(
                "turn key '{key}' belongs to goal '{}' and agent '{}'; pick a new key",
                rec.goal_id, rec.agent_id
            )));
        }
        if rec.status != JournalStatus::InProgress {
            return stored_outcome(kernel, key);
        }
        let Some(o) = recover_one(kernel, key)? else {
            return Err(conflict(format!(
                "turn '{key}' is in flight in another process; `loopx turn inspect --turn-key {key}` shows it"
            )));
        };
        return Ok(o);
    }
    let recovered_turns: Vec<String> = recover(kernel, Some(&req.goal_id), None)?
        .into_iter()
        .filter(|o| o.status != Some(JournalStatus::InProgress))
        .filter_map(|o| o.turn_key)
        .collect();
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
    let cwd = std::env::current_dir()
        .map_err(|e| LoopxError::internal("reading the working directory", e))?;
    // A relative program path (`./host.sh`) means relative to where `loopx` was started, not to
    // the goal's project directory the host runs in.
    let absolutize = |argv: &[String]| -> Vec<String> {
        let mut argv = argv.to_vec();
        if argv[0].contains('/') && !argv[0].starts_with('/') {
            argv[0] = cwd.join(&argv[0]).to_string_lossy().into_owned();
        }
        argv
    };
    let host_argv = absolutize(&req.host_argv);
    let validate_argv = req.validate_argv.as_deref().map(absolutize);
    let project_root = kernel.paths().project.clone();
    let started_ms = now_ms();
    let start_clock = Instant::now();
    let actor = turn_actor(&req.agent_id, &turn_key);
    let start = StartTurn {
        turn_key: turn_key.clone(),
        goal_id: req.goal_id.clone(),
        agent_id: req.agent_id.clone(),
        todo_id: req.todo_id.clone(),
        ttl_seconds: (req.timeout_seconds + LEASE_MARGIN_SECONDS).min(MAX_TTL_SECONDS),
    };
    let mut journal: Option<JournalData> = None;
    let start = kernel.start_turn(&actor, &start, |grant| {
        let todo = grant.todo;
        let goal = grant.goal;
        let capability = req
            .capability
            .clone()
            .or_else(|| todo.capability.clone())
            .unwrap_or_else(|| BUILTIN.to_string());
        let host_cwd = goal
            .project_dir
            .as_ref()
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| cwd.clone());
        let claim = ClaimInfo {
            fence: grant.claim.fence,
            claim_key: grant.claim.idempotency_key.clone(),
            expires_at: grant.claim.expires_at,
        };
        let request = json!({
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
            "result_schema": result_schema_hint(),
        });
        let mut data = JournalData {
            schema_version: JOURNAL_SCHEMA.to_string(),
            request,
            host_argv: host_argv.clone(),
            validate_argv: validate_argv.clone(),
            timeout_ms: req.timeout_seconds * 1000,
            trust_host_completion: req.trust_host_completion,
            capability,
            cwd: host_cwd.to_string_lossy().into_owned(),
            project_root: project_root.to_string_lossy().into_owned(),
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
            started_at: started_ms,
            settled_at: None,
            isolation,
        };
        data.timings_us.insert(
            "start".to_string(),
            start_clock.elapsed().as_micros() as u64,
        );
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
fn recover_one(kernel: &mut Kernel, turn_key: &str) -> Result<Option<TurnOutcome>> {
    let Some(lock) = TurnLock::try_acquire(kernel, turn_key)? else {
        return Ok(None);
    };
    let mut rec = inspect(kernel, turn_key)?;
    // A row that cannot be read back is settled as failed rather than blocking recovery.
    if rec.status == JournalStatus::InProgress
        && let Some(why) = super::journal_repair::undecodable_reason(&rec)
    {
        let o = super::journal_repair::settle_undecodable(kernel, &rec, &why);
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

/// The phase to run next, from the journal alone.
fn next_phase(rec: &TurnRecord, data: &JournalData) -> Phase {
    let failed = data.kind.is_some_and(TurnResultKind::is_failure);
    match rec.phases.last().copied() {
        None => Phase::HostExecute,
        Some(Phase::HostExecute) => Phase::TypedResult,
        Some(Phase::TypedResult) if failed => Phase::TerminalCloseout,
        Some(Phase::TypedResult) => Phase::Validation,
        Some(Phase::Validation) if failed => Phase::TerminalCloseout,
        Some(Phase::Validation) => Phase::DurableWriteback,
        Some(Phase::DurableWriteback) if data.kind.is_some_and(TurnResultKind::spends) => {
            Phase::QuotaSpend
        }
        Some(Phase::DurableWriteback | Phase::QuotaSpend | Phase::TerminalCloseout) => {
            Phase::TerminalCloseout
        }
    }
}

/// Commits `phase` through the kernel (`Kernel::commit_turn_phase`): the row must still have the
/// phases we last saw; the kernel applies `effect`, `update` records its outcome in the journal
/// data (returning the run row when this phase records it), and the phase is appended (settling
/// the status on `terminal_closeout`), all in one transaction.
fn commit_phase(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    phase: Phase,
    started: Instant,
    effect: PhaseEffect,
    update: impl FnOnce(EffectOutcome, &mut JournalData, i64) -> Result<Option<Run>>,
) -> Result<()> {
    let mut next = data.clone();
    let actor = turn_actor(&rec.agent_id, &rec.turn_key);
    let stored = kernel.commit_turn_phase(
        &actor,
        &rec.turn_key,
        &rec.phases,
        phase,
        effect,
        |outcome, now| {
            let run = update(outcome, &mut next, now)?;
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
fn unexpected(phase: Phase, outcome: &EffectOutcome) -> LoopxError {
    LoopxError::internal(
        format!("committing turn phase {phase}"),
        anyhow::anyhow!("unexpected effect outcome {outcome:?}"),
    )
}

fn fail(data: &mut JournalData, kind: TurnResultKind, phase: Phase, why: String) {
    data.kind = Some(kind);
    data.failed_phase = Some(phase);
    data.failure = Some(why);
}

/// What a host or validator process runs with: its sandbox and the agent channel through which
/// its `loopx` calls reach this driver. Dropping it closes the channel.
struct AgentSide {
    sandbox: Option<Sandbox>,
    channel: Option<ChannelServer>,
    warning: Option<String>,
}

impl AgentSide {
    /// `Err` when the turn started isolated and this process cannot isolate: the process is
    /// then not run at all rather than run with access to `.loopx/`.
    fn prepare(
        kernel: &Kernel,
        rec: &TurnRecord,
        data: &JournalData,
    ) -> std::result::Result<AgentSide, String> {
        let sandbox = match data.isolation {
            Isolation::None => None,
            Isolation::Namespace => {
                isolation::resolve(IsolationMode::Required, &kernel.paths().state)
                    .map_err(|e| e.to_string())?
                    .0
            }
        };
        let identity = TurnIdentity {
            goal_id: rec.goal_id.clone(),
            agent_id: rec.agent_id.clone(),
            turn_key: rec.turn_key.clone(),
            claim_key: data.claim.claim_key.clone(),
            fence: data.claim.fence,
        };
        let (channel, warning) = match ChannelServer::start(kernel.paths(), identity) {
            Ok(channel) => (channel, None),
            Err(e) => (
                None,
                Some(format!(
                    "the agent channel could not be started ({e}): the host's loopx calls fail"
                )),
            ),
        };
        Ok(AgentSide {
            sandbox,
            channel,
            warning,
        })
    }

    fn env(&self, rec: &TurnRecord, data: &JournalData) -> Vec<(String, String)> {
        let mut env = host_env(rec, data);
        if let Some(channel) = &self.channel {
            env.push((
                SOCKET_ENV.to_string(),
                channel.socket().to_string_lossy().into_owned(),
            ));
        }
        env
    }
}

fn host_env(rec: &TurnRecord, data: &JournalData) -> Vec<(String, String)> {
    vec![
        ("LOOPX_GOAL_ID".into(), rec.goal_id.clone()),
        ("LOOPX_AGENT_ID".into(), rec.agent_id.clone()),
        (
            "LOOPX_TODO_ID".into(),
            rec.todo_id.clone().unwrap_or_default(),
        ),
        ("LOOPX_TURN_KEY".into(), rec.turn_key.clone()),
        ("LOOPX_CLAIM_KEY".into(), data.claim.claim_key.clone()),
        ("LOOPX_FENCE".into(), data.claim.fence.to_string()),
        ("LOOPX_ROOT".into(), data.project_root.clone()),
    ]
}

fn make_run(rec: &TurnRecord, data: &JournalData, kind: TurnResultKind, now: i64) -> Run {
    let summary = match (&data.failure, &data.result) {
        (Some(f), _) => format!("{kind}: {f}"),
        (None, Some(r)) if !r.summary.trim().is_empty() => r.summary.clone(),
        _ => kind.to_string(),
    };
    let summary: String = summary.chars().take(4000).collect();
    Run {
        id: new_ulid(),
        goal_id: rec.goal_id.clone(),
        agent_id: Some(rec.agent_id.clone()),
        todo_id: rec.todo_id.clone(),
        classification: kind.as_str().to_string(),
        outcome: data.result.as_ref().map(|r| r.status.as_str().to_string()),
        summary,
        payload: json!({
            "turn_key": rec.turn_key,
            "kind": kind,
            "capability": data.capability,
            "host": data.host.as_ref().map(|h| json!({
                "argv": data.host_argv,
                "exit_code": h.exit_code,
                "signal": h.signal,
                "timed_out": h.timed_out,
                "interrupted": h.interrupted,
                "elapsed_ms": h.elapsed_ms,
                "stdout_bytes": h.stdout_bytes,
                "outcome": h.describe(),
            })),
            "result": data.result,
            "result_error": data.result_error,
            "validation": data.validation.as_ref().map(|v| json!({
                "ran": v.ran, "passed": v.passed, "completion_validated": v.completion_validated, "detail": v.detail,
            })),
            "writeback": data.writeback.as_ref().map(|w| json!({
                "capability": w.capability, "accepted": w.accepted, "refused": w.refused,
                "verdicts": w.verdicts, "error": w.error,
            })),
            "failed_phase": data.failed_phase,
            "failure": data.failure,
        }),
        created_at: now,
    }
}

/// Who a turn's writes come from: its agent, inside the turn (the kernel refuses anyone else).
/// The lease proof is the kernel's to attach: it releases the lease only if this turn holds it.
fn turn_actor(agent_id: &str, turn_key: &str) -> Actor {
    Actor::Agent {
        agent_id: agent_id.to_string(),
        proof: None,
        turn_key: Some(turn_key.to_string()),
    }
}

fn write_report(kernel: &Kernel, run: &Run, warnings: &mut Vec<String>) {
    if kernel.paths().run_json(&run.goal_id, &run.id).exists() {
        return;
    }
    if let Err(e) = kernel.write_run_report(run) {
        warnings.push(format!("run report {}: {e}", run.id));
    }
}

/// Runs phases until the turn is settled. `can_run_host` is false during recovery: a host whose
/// outcome was never journaled is not run again.
fn advance(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    can_run_host: bool,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    while rec.status == JournalStatus::InProgress {
        let started = Instant::now();
        match next_phase(rec, data) {
            Phase::HostExecute if !can_run_host => {
                fail(
                    data,
                    TurnResultKind::HostFailure,
                    Phase::HostExecute,
                    "host outcome unknown: loopx stopped before host_execute was journaled; \
                     the host is not run again and the lease is released"
                        .to_string(),
                );
                closeout(kernel, rec, data, started, &mut warnings)?;
            }
            Phase::HostExecute => {
                let outcome = match AgentSide::prepare(kernel, rec, data) {
                    Ok(side) => {
                        warnings.extend(side.warning.clone());
                        let spec = ProcessSpec {
                            argv: &data.host_argv,
                            cwd: std::path::Path::new(&data.cwd),
                            env: side.env(rec, data),
                            stdin: serde_json::to_vec(&data.request).expect("request serializes"),
                            timeout: Duration::from_millis(data.timeout_ms),
                            stdout_cap: MAX_STDOUT,
                            stderr_cap: MAX_STDERR_TAIL,
                            sandbox: side.sandbox.as_ref(),
                        };
                        run_process(&spec)
                    }
                    Err(why) => ProcessOutcome {
                        spawn_error: Some(why),
                        ..ProcessOutcome::default()
                    },
                };
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::HostExecute,
                    started,
                    PhaseEffect::JournalOnly,
                    |_, d, _| {
                        d.host = Some(outcome);
                        Ok(None)
                    },
                )?;
            }
            Phase::TypedResult => {
                let host = data.host.clone().unwrap_or_default();
                let key = rec.turn_key.clone();
                let effect = PhaseEffect::JournalOnly;
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::TypedResult,
                    started,
                    effect,
                    |_, d, _| {
                        if !host.exited_ok() {
                            let why = match parse_result(&host, &key) {
                                Ok(_) => format!("host {}", host.describe()),
                                Err(e) => format!("host {} (result: {e})", host.describe()),
                            };
                            fail(d, TurnResultKind::HostFailure, Phase::HostExecute, why);
                            return Ok(None);
                        }
                        match parse_result(&host, &key) {
                            Ok(r) => d.result = Some(r),
                            Err(e) => {
                                d.result_error = Some(e.clone());
                                fail(
                                    d,
                                    TurnResultKind::ValidationFailed,
                                    Phase::TypedResult,
                                    format!("host exited 0 but its result is malformed: {e}"),
                                );
                            }
                        }
                        Ok(None)
                    },
                )?;
            }
            Phase::Validation => {
                let record = validate(kernel, rec, data);
                let effect = PhaseEffect::JournalOnly;
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::Validation,
                    started,
                    effect,
                    |_, d, _| {
                        if !record.passed {
                            fail(
                                d,
                                TurnResultKind::ValidationFailed,
                                Phase::Validation,
                                format!("validator rejected the result: {}", record.detail),
                            );
                        }
                        d.validation = Some(record);
                        Ok(None)
                    },
                )?;
            }
            Phase::DurableWriteback => writeback(kernel, rec, data, started, &mut warnings)?,
            Phase::QuotaSpend => {
                commit_phase(
                    kernel,
                    rec,
                    data,
                    Phase::QuotaSpend,
                    started,
                    PhaseEffect::Spend,
                    |outcome, d, _| {
                        match outcome {
                            EffectOutcome::Spent(Ok(receipt)) => {
                                d.spend = Some(SpendRecord {
                                    effect_id: receipt.entry.effect_id,
                                    slots: receipt.entry.slots,
                                    idempotent_replay: receipt.idempotent_replay,
                                })
                            }
                            EffectOutcome::Spent(Err(e)) => fail(
                                d,
                                TurnResultKind::QuotaSpendFailed,
                                Phase::QuotaSpend,
                                e.to_string(),
                            ),
                            other => return Err(unexpected(Phase::QuotaSpend, &other)),
                        }
                        Ok(None)
                    },
                )?;
            }
            Phase::TerminalCloseout => closeout(kernel, rec, data, started, &mut warnings)?,
        }
    }
    Ok(warnings)
}

/// The validation verdict (runs the validator for `progress`/`completed` claims).
fn validate(kernel: &Kernel, rec: &TurnRecord, data: &JournalData) -> ValidationRecord {
    let result = data
        .result
        .as_ref()
        .expect("validation follows a parsed result");
    let delivery = matches!(result.status, HostStatus::Progress | HostStatus::Completed);
    let completed = result.status == HostStatus::Completed;
    if !delivery {
        return ValidationRecord {
            ran: false,
            passed: true,
            completion_validated: false,
            detail: format!(
                "'{}' claims no delivery; nothing to validate",
                result.status
            ),
            validator: None,
        };
    }
    let Some(argv) = &data.validate_argv else {
        let (completion_validated, detail) = match (completed, data.trust_host_completion) {
            (true, true) => (
                true,
                "no validator; completion trusted (--trust-host-completion)".to_string(),
            ),
            (true, false) => (
                false,
                "no validator: the completion claim is recorded as progress (pass --validate-json, or --trust-host-completion)".to_string(),
            ),
            (false, _) => (false, "no validator; progress recorded".to_string()),
        };
        return ValidationRecord {
            ran: false,
            passed: true,
            completion_validated,
            detail,
            validator: None,
        };
    };
    let outcome = match AgentSide::prepare(kernel, rec, data) {
        Ok(side) => run_process(&ProcessSpec {
            argv,
            cwd: std::path::Path::new(&data.cwd),
            env: side.env(rec, data),
            stdin: serde_json::to_vec(result).expect("result serializes"),
            timeout: Duration::from_millis(data.timeout_ms),
            stdout_cap: 4096,
            stderr_cap: MAX_STDERR_TAIL,
            sandbox: side.sandbox.as_ref(),
        }),
        Err(why) => ProcessOutcome {
            spawn_error: Some(why),
            ..ProcessOutcome::default()
        },
    };
    let passed = outcome.exited_ok();
    ValidationRecord {
        ran: true,
        passed,
        completion_validated: passed && completed,
        detail: format!("validator {}", outcome.describe()),
        validator: Some(outcome),
    }
}

fn writeback(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    started: Instant,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let result = data
        .result
        .clone()
        .expect("writeback follows a parsed result");
    let todo_id = rec.todo_id.clone().unwrap_or_default();
    let completion_validated = data
        .validation
        .as_ref()
        .is_some_and(|v| v.completion_validated);
    let (proposals, call, cap_error) = if data.capability == BUILTIN {
        (
            builtin_proposals(&todo_id, &rec.agent_id, &result, completion_validated),
            Value::Null,
            None,
        )
    } else {
        let payload = capability_payload(&rec.turn_key, &todo_id, &result, completion_validated);
        match wasm_proposals(
            kernel,
            &data.capability,
            &rec.goal_id,
            &rec.agent_id,
            payload,
        ) {
            Ok((p, call)) => (p, call, None),
            Err(e) => (Vec::new(), Value::Null, Some(e)),
        }
    };
    let effect = match &cap_error {
        Some(_) => PhaseEffect::JournalOnly,
        None => PhaseEffect::Admit {
            source: ProposalSource {
                goal_id: rec.goal_id.clone(),
                agent_id: Some(rec.agent_id.clone()),
                capability: data.capability.clone(),
                turn_key: Some(rec.turn_key.clone()),
            },
            proposals: proposals.clone(),
        },
    };
    let rec_snapshot = rec.clone();
    let mut run_written: Option<Run> = None;
    commit_phase(
        kernel,
        rec,
        data,
        Phase::DurableWriteback,
        started,
        effect,
        |outcome, d, now| {
            let mut wb = WritebackRecord {
                capability: d.capability.clone(),
                proposals: proposals.clone(),
                verdicts: Vec::new(),
                accepted: 0,
                refused: 0,
                error: cap_error.clone(),
                todo_status_after: None,
                call,
            };
            if let Some(e) = &cap_error {
                fail(
                    d,
                    TurnResultKind::WritebackFailed,
                    Phase::DurableWriteback,
                    e.clone(),
                );
                d.writeback = Some(wb);
                return Ok(None);
            }
            let EffectOutcome::Admitted {
                report,
                todo_status_after: after,
            } = outcome
            else {
                return Err(unexpected(Phase::DurableWriteback, &outcome));
            };
            wb.verdicts = report.verdicts.clone();
            wb.accepted = report.accepted;
            wb.refused = report.refused;
            wb.todo_status_after = after;
            d.writeback = Some(wb);
            let kind = if !proposals.is_empty() && report.accepted == 0 {
                let first = report
                    .verdicts
                    .first()
                    .map(|v| format!("{}: {}", v.transition, v.reason))
                    .unwrap_or_default();
                fail(
                    d,
                    TurnResultKind::WritebackFailed,
                    Phase::DurableWriteback,
                    format!("every proposal was refused (first: {first})"),
                );
                TurnResultKind::WritebackFailed
            } else {
                let k = match result.status {
                    HostStatus::Completed if after == Some(TodoStatus::Completed) => {
                        TurnResultKind::ValidatedCompletion
                    }
                    HostStatus::Progress | HostStatus::Completed => {
                        TurnResultKind::ValidatedProgress
                    }
                    HostStatus::RepairRequired => TurnResultKind::RepairRequired,
                    HostStatus::ReplanRequired => TurnResultKind::ReplanRequired,
                    HostStatus::UserActionRequired => TurnResultKind::UserActionRequired,
                    HostStatus::Wait => TurnResultKind::Wait,
                };
                d.kind = Some(k);
                k
            };
            let run = make_run(&rec_snapshot, d, kind, now);
            d.run_id = Some(run.id.clone());
            run_written = Some(run.clone());
            Ok(Some(run))
        },
    )?;
    if let Some(run) = run_written {
        write_report(kernel, &run, warnings);
    }
    Ok(())
}

/// Releases the lease (unless completion or a block already cleared it), records the run row when
/// no earlier phase did, and settles the journal status.
fn closeout(
    kernel: &mut Kernel,
    rec: &mut TurnRecord,
    data: &mut JournalData,
    started: Instant,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let snapshot = rec.clone();
    let mut run_written: Option<Run> = None;
    commit_phase(
        kernel,
        rec,
        data,
        Phase::TerminalCloseout,
        started,
        PhaseEffect::Release(LeaseHeld::Fence(data.claim.fence)),
        |outcome, d, now| {
            let EffectOutcome::Lease(lease) = outcome else {
                return Err(unexpected(Phase::TerminalCloseout, &outcome));
            };
            let lease = match lease {
                LeaseOutcome::TodoGone => "not_held: the todo no longer exists".to_string(),
                LeaseOutcome::Cleared => "cleared".to_string(),
                LeaseOutcome::NotHeld(c) => {
                    format!("not_held: taken over by {} (fence {})", c.agent_id, c.fence)
                }
                LeaseOutcome::Released(_) => "released".to_string(),
                LeaseOutcome::Refused(e) => {
                    fail(
                        d,
                        TurnResultKind::TerminalCloseoutFailed,
                        Phase::TerminalCloseout,
                        format!("the lease could not be released: {e}"),
                    );
                    format!("not_released: {e}")
                }
            };
            d.lease = Some(lease);
            if d.kind.is_none() {
                fail(
                    d,
                    TurnResultKind::TerminalCloseoutFailed,
                    Phase::TerminalCloseout,
                    "the turn reached closeout without a result kind".to_string(),
                );
            }
            if d.run_id.is_some() {
                return Ok(None);
            }
            let kind = d.kind.expect("set above");
            let run = make_run(&snapshot, d, kind, now);
            d.run_id = Some(run.id.clone());
            run_written = Some(run.clone());
            Ok(Some(run))
        },
    )?;
    if let Some(run) = run_written {
        write_report(kernel, &run, warnings);
    } else if let Some(run_id) = &data.run_id {
        // A recovered turn whose report was not written before the crash.
        if !kernel.paths().run_json(&rec.goal_id, run_id).exists()
            && let Some(run) = kernel.run(&rec.goal_id, run_id)?
        {
            write_report(kernel, &run, warnings);
        }
    }
    Ok(())
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
