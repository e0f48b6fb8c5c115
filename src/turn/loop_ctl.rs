//! `loopx loop`: turns under a bounded budget, steered by a pure loop controller.
//!
//! [`decide_loop`] is a pure function of the last turn's outcome, the fresh decision's route and
//! the budget; it launches nothing and writes nothing. [`run_loop`] carries its dispositions out:
//! run a turn, sleep per the scheduler hint, or stop. SIGINT/SIGTERM (see
//! [`super::host::install_stop_handlers`]) terminate the host's process group, the turn in flight
//! settles (as `host_failure`), and the loop stops.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::TurnResultKind;
use super::driver::{PROJECTION_INTERVAL_MS, refresh_projection, run_turn};
use super::host::stop_requested;
use super::outcome::{TurnOutcome, plan};
use super::probe_call::ProbeFn;
use super::recovery::settle_orphans;
use super::request::TurnRequest;
use crate::clock::now_ms;
use crate::error::{Result, bad_input};
use crate::kernel::Actor;
use crate::kernel::decision::TurnRoute;
use crate::kernel::monitor::Observation;
use crate::kernel::watch::ChangeWatcher;
use crate::kernel::{Kernel, SchemaUpgrade};
use crate::model::wire_enum;

pub const LOOP_SCHEMA: &str = "loopx.loop_report.v1";

wire_enum!(
    /// What the loop does next.
    LoopDisposition {
        RunNow => "run_now",
        Wait => "wait",
        UserActionRequired => "user_action_required",
        Repair => "repair",
        Replan => "replan",
        /// Turns kept reporting delivery on one todo that nothing proved: the loop stops before
        /// it spends more quota on them.
        NoValidatedProgress => "no_validated_progress",
        Terminal => "terminal",
    }
);

/// Default for `--max-unvalidated-turns`.
pub const DEFAULT_MAX_UNVALIDATED_TURNS: u32 = 3;

/// The bounded turn budget of one `loopx loop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Budget {
    pub max_turns: u32,
    pub completed_turns: u32,
    /// Failure kinds in a row, most recent last.
    pub consecutive_failures: u32,
    /// This many failures in a row turn into `repair` (the loop stops).
    pub max_consecutive_failures: u32,
    /// Turns in a row on the same todo whose delivery no validator proved.
    pub unvalidated_turns: u32,
    /// This many unvalidated turns in a row on one todo stop the loop (`no_validated_progress`).
    pub max_unvalidated_turns: u32,
}

impl Budget {
    pub fn new(max_turns: u32, max_consecutive_failures: u32) -> Budget {
        Budget {
            max_turns,
            completed_turns: 0,
            consecutive_failures: 0,
            max_consecutive_failures,
            unvalidated_turns: 0,
            max_unvalidated_turns: DEFAULT_MAX_UNVALIDATED_TURNS,
        }
    }

    /// Counts a settled turn; `same_todo` says it worked the todo the previous turn worked.
    pub fn record_turn(&mut self, outcome: &TurnOutcome, same_todo: bool) {
        let Some(kind) = outcome.kind else { return };
        self.record(kind);
        let unproven = matches!(
            kind,
            TurnResultKind::ValidatedProgress | TurnResultKind::ValidatedCompletion
        ) && !outcome.validated;
        self.unvalidated_turns = match (unproven, same_todo) {
            (false, _) => 0,
            (true, true) => self.unvalidated_turns + 1,
            (true, false) => 1,
        };
    }

    pub fn remaining(&self) -> u32 {
        self.max_turns.saturating_sub(self.completed_turns)
    }

    /// Counts a settled turn.
    pub fn record(&mut self, kind: TurnResultKind) {
        self.completed_turns += 1;
        if kind.is_failure() {
            self.consecutive_failures += 1;
        } else {
            self.consecutive_failures = 0;
        }
    }
}

/// The loop controller. Pure: no I/O, no state.
///
/// | Input (first match wins) | Disposition |
/// |---|---|
/// | budget used up | `terminal` |
/// | last turn `replan_required` | `replan` |
/// | last turn `repair_required` | `repair` |
/// | last turn `user_action_required` | `user_action_required` |
/// | last turn `wait` | `wait` |
/// | last turn a failure kind, `max_consecutive_failures` in a row | `repair` |
/// | `max_unvalidated_turns` unproven deliveries in a row on one todo | `no_validated_progress` |
/// | route `ready_for_host` | `run_now` |
/// | route `replan_required` | `replan` |
/// | route `repair_required` | `repair` |
/// | route `user_action_required` | `user_action_required` |
/// | route `wait` or `blocked` | `wait` |
/// | route `contract_error` | `terminal` |
pub fn decide_loop(
    last: Option<&TurnOutcome>,
    decision_route: TurnRoute,
    budget: &Budget,
) -> LoopDisposition {
    if budget.completed_turns >= budget.max_turns {
        return LoopDisposition::Terminal;
    }
    if let Some(kind) = last.and_then(|o| o.kind) {
        match kind {
            TurnResultKind::ReplanRequired => return LoopDisposition::Replan,
            TurnResultKind::RepairRequired => return LoopDisposition::Repair,
            TurnResultKind::UserActionRequired => return LoopDisposition::UserActionRequired,
            TurnResultKind::Wait => return LoopDisposition::Wait,
            k if k.is_failure()
                && budget.consecutive_failures >= budget.max_consecutive_failures =>
            {
                return LoopDisposition::Repair;
            }
            _ => {}
        }
    }
    if budget.unvalidated_turns >= budget.max_unvalidated_turns {
        return LoopDisposition::NoValidatedProgress;
    }
    match decision_route {
        TurnRoute::ReadyForHost => LoopDisposition::RunNow,
        TurnRoute::ReplanRequired => LoopDisposition::Replan,
        TurnRoute::RepairRequired => LoopDisposition::Repair,
        TurnRoute::UserActionRequired => LoopDisposition::UserActionRequired,
        TurnRoute::Wait | TurnRoute::Blocked => LoopDisposition::Wait,
        TurnRoute::ContractError => LoopDisposition::Terminal,
    }
}

/// A `loopx loop` invocation.
#[derive(Debug, Clone)]
pub struct LoopRequest {
    /// The turn to repeat (its `turn_key` is ignored: every turn gets a fresh key).
    pub turn: TurnRequest,
    pub max_turns: u32,
    /// Stop instead of sleeping once nothing is runnable for this agent and no other agent holds
    /// work on the goal.
    pub until_idle: bool,
    /// Longest sleep between decisions.
    pub max_sleep_seconds: u64,
    pub max_consecutive_failures: u32,
    /// Unproven deliveries in a row on one todo after which the loop stops.
    pub max_unvalidated_turns: u32,
}

/// What a loop did.
#[derive(Debug, Clone, Serialize)]
pub struct LoopReport {
    pub schema_version: &'static str,
    pub goal_id: String,
    pub agent_id: String,
    pub turns: Vec<TurnOutcome>,
    pub budget: Budget,
    pub final_disposition: LoopDisposition,
    pub final_route: TurnRoute,
    pub stop_reason: String,
    pub interrupted: bool,
    pub elapsed_ms: u64,
    /// Turns of drivers that died, settled by this loop while it waited (`turn recover`'s work:
    /// a dead driver's turn holds its todo until someone settles it).
    pub recovered_turns: Vec<String>,
    /// Projection problems (the turns themselves settled).
    pub warnings: Vec<String>,
}

/// Sleeps up to `d`, waking early on SIGINT/SIGTERM.
fn sleep_interruptible(d: Duration) {
    let end = Instant::now() + d;
    while !stop_requested() {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(Duration::from_millis(100)));
    }
}

/// Whether another agent holds a live lease on this goal (its work may unlock ours).
fn others_working(kernel: &mut Kernel, goal_id: &str, agent_id: &str) -> Result<bool> {
    let now = now_ms();
    Ok(kernel
        .todos(goal_id)?
        .iter()
        .any(|t| t.live_claim(now).is_some_and(|c| c.agent_id != agent_id)))
}

/// What [`run_loop`] reports as it goes, for progress lines.
#[derive(Debug)]
pub enum LoopEvent<'a> {
    /// A turn settled: its number in this loop, the budget after it, its outcome.
    Turn {
        n: u32,
        budget: &'a Budget,
        outcome: &'a TurnOutcome,
    },
    /// The loop is about to wait: what for (the disposition and the decision's reason) and how
    /// long until it decides again, unless a signal ends the wait first.
    Wait {
        disposition: LoopDisposition,
        reason: &'a str,
        seconds: u64,
    },
}

/// Runs turns until the controller says stop, the budget is used up, or a signal arrives.
/// `on_event` hears every settled turn and every wait (for progress lines).
pub fn run_loop(
    kernel: &mut Kernel,
    req: &LoopRequest,
    mut on_event: impl FnMut(LoopEvent<'_>),
) -> Result<LoopReport> {
    if req.max_turns == 0 {
        return Err(bad_input("--max-turns must be at least 1"));
    }
    super::request::check_request(&req.turn)?;
    let started = Instant::now();
    let goal_id = req.turn.goal_id.clone();
    let agent_id = req.turn.agent_id.clone();
    if req.max_unvalidated_turns == 0 {
        return Err(bad_input(
            "--max-unvalidated-turns must be at least 1 (use a large number to allow more)",
        ));
    }
    let mut budget = Budget::new(req.max_turns, req.max_consecutive_failures.max(1));
    budget.max_unvalidated_turns = req.max_unvalidated_turns;
    let mut turns: Vec<TurnOutcome> = Vec::new();
    let mut recovered_turns: Vec<String> = Vec::new();
    let mut last: Option<TurnOutcome> = None;
    let max_sleep = Duration::from_secs(req.max_sleep_seconds.max(1));
    let mut warnings: Vec<String> = Vec::new();
    let mut projected_at = 0i64;
    // The route of the latest decision (reported when a signal ends the loop).
    let mut last_route = TurnRoute::Wait;
    let (disposition, route, stop_reason) = loop {
        if stop_requested() {
            break (
                LoopDisposition::Terminal,
                last_route,
                "interrupted by a signal".to_string(),
            );
        }
        let decision = plan(kernel, &goal_id, &agent_id)?;
        last_route = decision.route;
        let disposition = decide_loop(last.as_ref(), decision.route, &budget);
        let why = match &last {
            Some(o) if o.kind.is_some() && disposition != LoopDisposition::RunNow => format!(
                "after {} turn {}: {}",
                o.kind.map(|k| k.as_str()).unwrap_or("-"),
                o.turn_key.as_deref().unwrap_or("-"),
                decision.reason
            ),
            _ => decision.reason.clone(),
        };
        match disposition {
            LoopDisposition::RunNow => {
                if stop_requested() {
                    // Signalled during the decision: start nothing; the loop top reports it.
                    continue;
                }
                let mut turn = req.turn.clone();
                turn.turn_key = None;
                let outcome = run_turn(kernel, &turn)?;
                // A turn's warnings (a host run without isolation, a projection not written)
                // are the loop's too: its text shows the report's, once each.
                warnings.extend(outcome.warnings.iter().cloned());
                if outcome.kind.is_none() {
                    // Another agent took the work between the decision and the claim, or another
                    // turn of this agent works the lease.
                    sleep_interruptible(Duration::from_millis(100));
                    continue;
                }
                let same_todo = turns.last().is_some_and(|l| l.todo_id == outcome.todo_id);
                budget.record_turn(&outcome, same_todo);
                if now_ms() - projected_at >= PROJECTION_INTERVAL_MS {
                    warnings.extend(refresh_projection(kernel, &goal_id));
                    projected_at = now_ms();
                }
                on_event(LoopEvent::Turn {
                    n: budget.completed_turns,
                    budget: &budget,
                    outcome: &outcome,
                });
                turns.push(outcome.clone());
                last = Some(outcome);
            }
            LoopDisposition::Terminal if budget.remaining() == 0 => {
                break (
                    disposition,
                    decision.route,
                    format!("turn budget of {} used", budget.max_turns),
                );
            }
            LoopDisposition::NoValidatedProgress => {
                break (
                    disposition,
                    decision.route,
                    format!(
                        "{} turns in a row on todo '{}' reported delivery that no validator proved; \
                         pass --validate-json with a command that checks the work (or \
                         --trust-host-completion if the host's word is enough)",
                        budget.unvalidated_turns,
                        turns
                            .last()
                            .and_then(|o| o.todo_id.as_deref())
                            .unwrap_or("-")
                    ),
                );
            }
            LoopDisposition::Terminal | LoopDisposition::Repair => {
                break (disposition, decision.route, why);
            }
            LoopDisposition::Wait
            | LoopDisposition::UserActionRequired
            | LoopDisposition::Replan => {
                // A crashed agent's turn may be what holds the work: settle orphaned turns of the
                // goal (live ones are protected by their lock) and decide again at once if any.
                let settled = settle_orphans(kernel, &goal_id)?;
                if !settled.is_empty() {
                    recovered_turns.extend(settled);
                    last = None;
                    continue;
                }
                if req.until_idle {
                    let keep_waiting = disposition == LoopDisposition::Wait
                        && decision.route == TurnRoute::Wait
                        && decision.scheduler_action
                            != crate::kernel::decision::SchedulerAction::WaitForQuota
                        && others_working(kernel, &goal_id, &agent_id)?;
                    if !keep_waiting {
                        break (disposition, decision.route, format!("idle: {why}"));
                    }
                }
                let wait =
                    Duration::from_secs(decision.next_check_after_seconds.max(1)).min(max_sleep);
                on_event(LoopEvent::Wait {
                    disposition,
                    reason: &why,
                    seconds: wait.as_secs(),
                });
                sleep_interruptible(wait);
                // The receipt has been acted on; the next decision starts fresh.
                last = None;
            }
        }
    };
    if !turns.is_empty() {
        warnings.extend(refresh_projection(kernel, &goal_id));
    }
    warnings.sort();
    warnings.dedup();
    Ok(LoopReport {
        schema_version: LOOP_SCHEMA,
        warnings,
        goal_id,
        agent_id,
        turns,
        budget,
        final_disposition: disposition,
        final_route: route,
        stop_reason,
        interrupted: stop_requested(),
        elapsed_ms: started.elapsed().as_millis() as u64,
        recovered_turns,
    })
}

pub const HEARTBEAT_SCHEMA: &str = "loopx.heartbeat_report.v1";

/// The longest the heartbeat blocks in one wait before it looks at the stop flag: a signal does
/// not end the change watcher's wait, so SIGTERM is noticed within this bound. One look at the
/// store's change counter per bound is all a sleeping heartbeat does.
const STOP_CHECK: Duration = Duration::from_secs(1);

/// A `loopx loop --watch` (runs until a signal) or `loopx loop --once` (one tick) invocation.
#[derive(Debug, Clone)]
pub struct HeartbeatRequest {
    /// The turn run when agent work or an agent-backed monitor is due (a fresh key each time).
    pub turn: TurnRequest,
    /// One tick: run what is due now, then stop instead of sleeping.
    pub once: bool,
    /// Most turns (`None`: no limit).
    pub max_turns: Option<u32>,
    /// Longest sleep between decisions.
    pub max_sleep_seconds: u64,
    pub max_consecutive_failures: u32,
    pub max_unvalidated_turns: u32,
}

/// One provider-backed check the heartbeat ran.
#[derive(Debug, Clone, Serialize)]
pub struct HeartbeatCheck {
    pub todo_id: String,
    pub check_seq: i64,
    /// `baseline`, `unchanged`, `changed` or `failed`; `superseded` when a newer check of the
    /// same monitor claimed it first.
    pub result: String,
    pub follow_up_todo: Option<String>,
    pub detail: Option<String>,
}

/// One run of the goal's provider probe the heartbeat made (once per revision of the probe).
#[derive(Debug, Clone, Serialize)]
pub struct HeartbeatProbeRun {
    pub run_seq: i64,
    pub revision: i64,
    /// `baseline`, `unchanged`, `changed` or `failed`.
    pub result: crate::model::CheckResult,
    pub digest: Option<String>,
    /// Why the run failed.
    pub detail: Option<String>,
}

/// What a heartbeat did.
#[derive(Debug, Clone, Serialize)]
pub struct HeartbeatReport {
    pub schema_version: &'static str,
    pub goal_id: String,
    pub agent_id: String,
    pub ticks: u64,
    pub checks: Vec<HeartbeatCheck>,
    /// Runs of the goal's provider probe (each new revision once).
    pub probe_runs: Vec<HeartbeatProbeRun>,
    pub turns: Vec<TurnOutcome>,
    pub ended_monitors: Vec<String>,
    pub resumed_todos: Vec<String>,
    /// Turns of drivers that died, settled by this heartbeat while it waited.
    pub recovered_turns: Vec<String>,
    pub final_route: TurnRoute,
    pub stop_reason: String,
    pub interrupted: bool,
    pub elapsed_ms: u64,
    pub warnings: Vec<String>,
}

/// Sleeps until `deadline_ms` on the clock, a commit by another process, or a stop signal.
fn sleep_until_change(
    watcher: &mut ChangeWatcher,
    deadline_ms: i64,
    max_sleep: Duration,
) -> Result<()> {
    // This process's own commits of the tick just ended are not news: absorb them first.
    watcher.wait(Some(Duration::ZERO))?;
    let started = Instant::now();
    let wanted = Duration::from_millis((deadline_ms - now_ms()).max(0) as u64).min(max_sleep);
    while !stop_requested() {
        let left = wanted.saturating_sub(started.elapsed());
        if left.is_zero() || watcher.wait(Some(left.min(STOP_CHECK)))? {
            return Ok(());
        }
    }
    Ok(())
}

/// The heartbeat: each tick ends monitors past `--until` and resumes deferred todos, runs the due
/// provider-backed checks and a new revision of the goal's provider probe (claimed in the kernel,
/// so an overlapping heartbeat or cron tick never runs one twice; no agent turn, no quota slot),
/// then runs agent turns while the decision says one is ready (agent work or an agent-backed
/// monitor). With `once` it stops there; otherwise it sleeps until the next thing is due or
/// another process commits, and goes on until a signal.
pub fn run_heartbeat(
    kernel: &mut Kernel,
    req: &HeartbeatRequest,
    probe: &mut ProbeFn<'_>,
    mut on_event: impl FnMut(&str),
) -> Result<HeartbeatReport> {
    super::request::check_request(&req.turn)?;
    if req.max_turns == Some(0) || req.max_unvalidated_turns == 0 {
        return Err(bad_input(
            "--max-turns and --max-unvalidated-turns must be at least 1",
        ));
    }
    let started = Instant::now();
    let goal_id = req.turn.goal_id.clone();
    let agent_id = req.turn.agent_id.clone();
    // A heartbeat's name in the operation log when it claims a check.
    let holder = format!("{agent_id}.pid{}", std::process::id());
    let mut watcher = if req.once {
        None
    } else {
        Some(ChangeWatcher::new(kernel.paths(), SchemaUpgrade::Apply)?)
    };
    let mut replacements = 0;
    let mut budget = Budget::new(
        req.max_turns.unwrap_or(u32::MAX),
        req.max_consecutive_failures.max(1),
    );
    budget.max_unvalidated_turns = req.max_unvalidated_turns;
    let max_sleep = Duration::from_secs(req.max_sleep_seconds.max(1));
    let mut report = HeartbeatReport {
        schema_version: HEARTBEAT_SCHEMA,
        goal_id: goal_id.clone(),
        agent_id: agent_id.clone(),
        ticks: 0,
        checks: Vec::new(),
        probe_runs: Vec::new(),
        turns: Vec::new(),
        ended_monitors: Vec::new(),
        resumed_todos: Vec::new(),
        recovered_turns: Vec::new(),
        final_route: TurnRoute::Wait,
        stop_reason: String::new(),
        interrupted: false,
        elapsed_ms: 0,
        warnings: Vec::new(),
    };
    let mut last: Option<TurnOutcome> = None;
    let mut projected_at = 0i64;
    report.stop_reason = loop {
        if stop_requested() {
            break "interrupted by a signal".to_string();
        }
        crate::clock::test_clock::load(&kernel.paths().state);
        report.ticks += 1;
        let swept = kernel.sweep_schedule(&goal_id)?;
        for id in &swept.ended_monitors {
            on_event(&format!("monitor {id} ended (its --until passed)"));
        }
        for id in &swept.resumed_todos {
            on_event(&format!("todo {id} resumed (its --until came)"));
        }
        report.ended_monitors.extend(swept.ended_monitors);
        report.resumed_todos.extend(swept.resumed_todos);
        for m in kernel.due_probe_monitors(&goal_id)? {
            if stop_requested() {
                break;
            }
            let Some(ticket) = kernel.claim_check(&goal_id, &m.todo_id, &holder)? else {
                continue; // another heartbeat claimed it first
            };
            let Some(spec) = &ticket.probe else { continue };
            let observation = match probe(kernel, spec) {
                Ok(text) => Observation::Value(text),
                Err(reason) => Observation::Failed(reason),
            };
            let check = match kernel.record_check(
                &Actor::Operator,
                &goal_id,
                &m.todo_id,
                &observation,
                Some(ticket.check_seq),
            ) {
                Ok(r) => HeartbeatCheck {
                    todo_id: m.todo_id.clone(),
                    check_seq: ticket.check_seq,
                    result: r.result.to_string(),
                    follow_up_todo: r.follow_up_todo,
                    detail: r.monitor.last_failure,
                },
                Err(e) if e.exit_code() == 4 || e.exit_code() == 1 => HeartbeatCheck {
                    todo_id: m.todo_id.clone(),
                    check_seq: ticket.check_seq,
                    result: "superseded".to_string(),
                    follow_up_todo: None,
                    detail: Some(e.to_string()),
                },
                Err(e) => return Err(e),
            };
            on_event(&format!(
                "check {} of monitor {}: {}",
                check.check_seq, check.todo_id, check.result
            ));
            report.checks.push(check);
        }
        // The goal's provider probe, once per revision: claimed first, so an overlapping
        // heartbeat finds it run.
        if !stop_requested()
            && let Some(run) = super::probe_call::run_goal_probe(
                kernel,
                &Actor::Operator,
                &goal_id,
                &holder,
                true,
                probe,
            )?
        {
            on_event(&format!(
                "goal probe run {} (revision {}): {}",
                run.probe.run_seq, run.probe.revision, run.result
            ));
            report.probe_runs.push(HeartbeatProbeRun {
                run_seq: run.probe.run_seq,
                revision: run.probe.revision,
                result: run.result,
                digest: run.digest,
                detail: run.probe.last_failure,
            });
        }
        let decision = plan(kernel, &goal_id, &agent_id)?;
        report.final_route = decision.route;
        match decide_loop(last.as_ref(), decision.route, &budget) {
            LoopDisposition::RunNow => {
                let mut turn = req.turn.clone();
                turn.turn_key = None;
                let outcome = run_turn(kernel, &turn)?;
                report.warnings.extend(outcome.warnings.iter().cloned());
                if outcome.kind.is_none() {
                    // Another agent or heartbeat took the work between the decision and the claim.
                    if req.once {
                        break format!("idle: {}", outcome.reason);
                    }
                    sleep_interruptible(Duration::from_millis(100));
                    continue;
                }
                let same_todo = report
                    .turns
                    .last()
                    .is_some_and(|l| l.todo_id == outcome.todo_id);
                budget.record_turn(&outcome, same_todo);
                if now_ms() - projected_at >= PROJECTION_INTERVAL_MS {
                    report.warnings.extend(refresh_projection(kernel, &goal_id));
                    projected_at = now_ms();
                }
                on_event(&format!(
                    "turn {} {}",
                    crate::inert::line(&outcome.short_line()),
                    crate::inert::line(outcome.turn_key.as_deref().unwrap_or(""))
                ));
                report.turns.push(outcome.clone());
                last = Some(outcome);
            }
            LoopDisposition::Terminal if budget.remaining() == 0 => {
                break format!("turn budget of {} used", budget.max_turns);
            }
            disposition => {
                let settled = settle_orphans(kernel, &goal_id)?;
                if !settled.is_empty() {
                    report.recovered_turns.extend(settled);
                    last = None;
                    continue;
                }
                if req.once {
                    break format!("tick done ({disposition}): {}", decision.reason);
                }
                let Some(w) = watcher.as_mut() else {
                    break format!("tick done ({disposition}): {}", decision.reason);
                };
                // Until the next thing is due: the decision's exact instant when it has one, or
                // its hint; a due provider-backed monitor of a goal waiting on quota wakes it
                // too (its checks spend none).
                let now = now_ms();
                let mut wake = decision
                    .wake_at
                    .unwrap_or(now + decision.next_check_after_seconds.max(1) as i64 * 1000);
                if let Some(next) = kernel.schedule(&goal_id)?.next_due_at {
                    wake = wake.min(next);
                }
                if matches!(
                    disposition,
                    LoopDisposition::Repair
                        | LoopDisposition::NoValidatedProgress
                        | LoopDisposition::Terminal
                ) {
                    // Nothing runs until someone changes the state (or a monitor falls due).
                    wake = kernel
                        .schedule(&goal_id)?
                        .next_due_at
                        .unwrap_or(now + max_sleep.as_millis() as i64);
                }
                sleep_until_change(w, wake, max_sleep)?;
                // A restore put another database at the path: the next tick works on it, not
                // on the replaced file (whose commits nobody would ever read).
                if w.replacements() != replacements {
                    kernel.reopen(SchemaUpgrade::Apply)?;
                    replacements = w.replacements();
                }
                last = None;
                budget.consecutive_failures = 0;
                budget.unvalidated_turns = 0;
            }
        }
    };
    if !report.turns.is_empty() {
        report.warnings.extend(refresh_projection(kernel, &goal_id));
    }
    report.warnings.sort();
    report.warnings.dedup();
    report.interrupted = stop_requested();
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::outcome::OUTCOME_SCHEMA;

    fn outcome(kind: TurnResultKind) -> TurnOutcome {
        TurnOutcome {
            schema_version: OUTCOME_SCHEMA,
            goal_id: "g".into(),
            agent_id: "a".into(),
            route: TurnRoute::ReadyForHost,
            reason: String::new(),
            turn_key: Some("turn-x".into()),
            todo_id: Some("t1".into()),
            kind: Some(kind),
            status: None,
            phases: Vec::new(),
            failed_phase: None,
            detail: String::new(),
            plugin_failure: None,
            run_id: None,
            spent: false,
            lease: None,
            replayed: false,
            recovered: false,
            recovered_turns: Vec::new(),
            next_check_after_seconds: 0,
            elapsed_ms: 0,
            warnings: Vec::new(),
            working_turn: None,
            validated: false,
            isolation: crate::turn::isolation::Isolation::None,
        }
    }

    #[test]
    fn routes_map_without_a_previous_turn() {
        let b = Budget::new(3, 2);
        let cases = [
            (TurnRoute::ReadyForHost, LoopDisposition::RunNow),
            (TurnRoute::ReplanRequired, LoopDisposition::Replan),
            (TurnRoute::RepairRequired, LoopDisposition::Repair),
            (
                TurnRoute::UserActionRequired,
                LoopDisposition::UserActionRequired,
            ),
            (TurnRoute::Wait, LoopDisposition::Wait),
            (TurnRoute::Blocked, LoopDisposition::Wait),
            (TurnRoute::ContractError, LoopDisposition::Terminal),
        ];
        for (route, want) in cases {
            assert_eq!(decide_loop(None, route, &b), want, "route {route}");
        }
    }

    #[test]
    fn exhausted_budget_is_terminal_whatever_the_route() {
        let mut b = Budget::new(2, 2);
        b.record(TurnResultKind::ValidatedProgress);
        assert_eq!(
            decide_loop(None, TurnRoute::ReadyForHost, &b),
            LoopDisposition::RunNow
        );
        b.record(TurnResultKind::ValidatedProgress);
        assert_eq!(b.remaining(), 0);
        let last = outcome(TurnResultKind::ValidatedProgress);
        for route in TurnRoute::ALL {
            assert_eq!(
                decide_loop(Some(&last), *route, &b),
                LoopDisposition::Terminal
            );
        }
    }

    #[test]
    fn receipts_steer_before_the_route() {
        let b = Budget::new(10, 2);
        let cases = [
            (TurnResultKind::ReplanRequired, LoopDisposition::Replan),
            (TurnResultKind::RepairRequired, LoopDisposition::Repair),
            (
                TurnResultKind::UserActionRequired,
                LoopDisposition::UserActionRequired,
            ),
            (TurnResultKind::Wait, LoopDisposition::Wait),
            (TurnResultKind::ValidatedProgress, LoopDisposition::RunNow),
            (TurnResultKind::ValidatedCompletion, LoopDisposition::RunNow),
        ];
        for (kind, want) in cases {
            assert_eq!(
                decide_loop(Some(&outcome(kind)), TurnRoute::ReadyForHost, &b),
                want,
                "kind {kind}"
            );
        }
        // A successful turn defers to the fresh route.
        assert_eq!(
            decide_loop(
                Some(&outcome(TurnResultKind::ValidatedCompletion)),
                TurnRoute::ReplanRequired,
                &b
            ),
            LoopDisposition::Replan
        );
    }

    #[test]
    fn failures_retry_until_the_streak_limit_then_repair() {
        let mut b = Budget::new(10, 2);
        for kind in [
            TurnResultKind::HostFailure,
            TurnResultKind::ValidationFailed,
            TurnResultKind::WritebackFailed,
            TurnResultKind::QuotaSpendFailed,
            TurnResultKind::TerminalCloseoutFailed,
        ] {
            let mut one = Budget::new(10, 2);
            one.record(kind);
            assert_eq!(
                decide_loop(Some(&outcome(kind)), TurnRoute::ReadyForHost, &one),
                LoopDisposition::RunNow,
                "{kind} once is retried"
            );
        }
        b.record(TurnResultKind::HostFailure);
        b.record(TurnResultKind::ValidationFailed);
        assert_eq!(b.consecutive_failures, 2);
        assert_eq!(
            decide_loop(
                Some(&outcome(TurnResultKind::ValidationFailed)),
                TurnRoute::ReadyForHost,
                &b
            ),
            LoopDisposition::Repair
        );
        b.record(TurnResultKind::ValidatedProgress);
        assert_eq!(b.consecutive_failures, 0);
    }
}
