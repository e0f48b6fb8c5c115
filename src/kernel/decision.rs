//! `quota should-run`: the pure decision of what this agent may do next on a goal.
//!
//! It reads one snapshot and writes nothing (the reference appended an event on every call). The
//! decision is one typed route plus the typed next actions that carry it out ([`NextAction`]):
//! the kernel says what to do and with which ids and keys; a front end says how. The CLI renders
//! each action as an exact `loopx` command (`cli::next_action`), so an agent host can execute the
//! packet without interpreting prose; another front end renders the same values its own way.

use serde::Serialize;
use serde_json::{Value, json};

use super::quota::{QuotaState, QuotaView, view_in_tx};
use super::{Kernel, require_goal};
pub use crate::action::NextAction;
use crate::clock::{now_ms, rfc3339};
use crate::error::Result;
use crate::ids::validate_token;
use crate::kernel::store::StoreRead;
use crate::model::{GoalStatus, QuotaPolicy, Role, Todo, TodoStatus, wire_enum};

pub const SHOULD_RUN_SCHEMA: &str = "loopx.should_run.v1";

wire_enum!(
    /// What may happen before a host runs (docs/turn-protocol.md, "Before the host: the route").
    TurnRoute {
        ReadyForHost => "ready_for_host",
        RepairRequired => "repair_required",
        ReplanRequired => "replan_required",
        UserActionRequired => "user_action_required",
        Wait => "wait",
        Blocked => "blocked",
        ContractError => "contract_error",
    }
);

wire_enum!(
    /// Why a todo was selected for the agent.
    SelectedBy {
        /// The agent already holds its lease: continue it.
        CurrentClaim => "current_claim",
        /// The best unclaimed ready todo: claim it before working.
        Ready => "ready",
    }
);

wire_enum!(
    /// What the scheduler running this agent should do before asking again (`scheduler_hint`).
    SchedulerAction {
        RunNow => "run_now",
        Stop => "stop",
        BackoffUntilResumed => "backoff_until_resumed",
        BackoffWaitingForUser => "backoff_waiting_for_user",
        BackoffUntilStateChange => "backoff_until_state_change",
        WaitForQuota => "wait_for_quota",
        WaitForTurn => "wait_for_turn",
        /// A monitor's check is due: the agent runs it (route `ready_for_host`), or, for a
        /// provider-backed monitor, the heartbeat does (route `wait`).
        MonitorDue => "monitor_due",
        /// Only monitors remain and none is due: ask again after the hint.
        MonitorQuiet => "monitor_quiet",
    }
);

wire_enum!(
    /// Who works next and how, derived from the route (the packet's `interaction_contract.mode`).
    InteractionMode {
        /// The agent runs one bounded turn on the selected todo.
        BoundedDelivery => "bounded_delivery",
        /// An operator resolves a gate first.
        UserGate => "user_gate",
        /// An operator installs or enables a missing capability first.
        CapabilityRepair => "capability_repair",
        /// The agent adds the next todos.
        AutonomousReplan => "autonomous_replan",
        Wait => "wait",
        Blocked => "blocked",
    }
);

/// Why a todo was selected.
#[derive(Debug, Clone, Serialize)]
pub struct SelectedTodo {
    pub todo: Todo,
    pub selected_by: SelectedBy,
    /// The claim key the commands use: the held one, or a deterministic one for the next grant.
    pub claim_key: String,
}

/// The decision for one agent on one goal at one instant.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub goal_id: String,
    pub agent_id: String,
    pub route: TurnRoute,
    pub reason: String,
    pub selected_todo: Option<SelectedTodo>,
    pub quota: QuotaView,
    /// Open gates that block this agent.
    pub blocking_gates: Vec<Todo>,
    /// Open user actions and gates scoped to other agents (informational).
    pub other_user_todos: Vec<Todo>,
    /// Capabilities bound by open todos that are not installed and enabled.
    pub missing_capabilities: Vec<String>,
    pub scheduler_action: SchedulerAction,
    pub next_check_after_seconds: u64,
    pub decided_at: i64,
    /// The live turn already working the lease this agent holds (route `wait`).
    pub working_turn: Option<String>,
    /// The due monitor (scheduler action `monitor_due`).
    pub monitor: Option<crate::model::Monitor>,
    /// The instant behind `next_check_after_seconds` when it is a scheduled event (a monitor due,
    /// a lease expiring, a deferred todo resuming), to the millisecond: the heartbeat sleeps
    /// until it.
    pub wake_at: Option<i64>,
}

/// How long a second turn of the same agent waits before deciding again while the first one
/// works the lease. Turns take seconds to minutes; polling every few seconds costs one read.
pub const WAIT_FOR_TURN_SECONDS: u64 = 5;

impl Decision {
    pub fn should_run(&self) -> bool {
        self.route == TurnRoute::ReadyForHost
    }

    /// What the agent should do next, in order.
    pub fn next_actions(&self) -> Vec<NextAction> {
        let goal_id = self.goal_id.clone();
        let agent_id = self.agent_id.clone();
        match self.route {
            TurnRoute::ReadyForHost => {
                let sel = self
                    .selected_todo
                    .as_ref()
                    .expect("ready routes select a todo");
                let todo_id = sel.todo.id.clone();
                let mut out = Vec::new();
                if sel.selected_by == SelectedBy::Ready {
                    out.push(NextAction::ClaimTodo {
                        goal_id: goal_id.clone(),
                        todo_id: todo_id.clone(),
                        agent_id: agent_id.clone(),
                        idempotency_key: sel.claim_key.clone(),
                    });
                }
                let (g, t, a, claim_key) = (
                    goal_id.clone(),
                    todo_id.clone(),
                    agent_id.clone(),
                    sel.claim_key.clone(),
                );
                // A monitor is checked, never completed.
                out.push(if sel.todo.kind == crate::model::TodoKind::Monitor {
                    NextAction::CheckMonitor {
                        goal_id: g,
                        todo_id: t,
                        agent_id: a,
                        claim_key,
                    }
                } else {
                    NextAction::CompleteTodo {
                        goal_id: g,
                        todo_id: t,
                        agent_id: a,
                        claim_key,
                    }
                });
                out.push(NextAction::RefreshState {
                    goal_id: goal_id.clone(),
                    agent_id: agent_id.clone(),
                    todo_id,
                });
                out.push(NextAction::SpendSlot { goal_id, agent_id });
                out
            }
            TurnRoute::ReplanRequired => vec![NextAction::AddTodo { goal_id, agent_id }],
            _ => Vec::new(),
        }
    }

    /// What only an operator can do to unblock this decision.
    pub fn operator_actions(&self) -> Vec<NextAction> {
        let goal_id = self.goal_id.clone();
        match self.route {
            TurnRoute::UserActionRequired => self
                .blocking_gates
                .iter()
                .map(|t| NextAction::ResolveGate {
                    goal_id: goal_id.clone(),
                    todo_id: t.id.clone(),
                })
                .collect(),
            TurnRoute::RepairRequired => {
                vec![
                    NextAction::ListExtensions,
                    NextAction::ListTodos { goal_id },
                ]
            }
            TurnRoute::Blocked if self.quota.state == QuotaState::Paused => {
                // The default policy's share: what the goal had before an operator paused it,
                // unless they had changed it. A goal paused by its slot count or slot length is
                // not unpaused by compute, so no command is named for it.
                if self.quota.policy.compute <= 0.0 && self.quota.policy.allowed_slots.is_none() {
                    vec![NextAction::SetCompute {
                        goal_id,
                        compute: QuotaPolicy::default().compute,
                    }]
                } else {
                    Vec::new()
                }
            }
            TurnRoute::Blocked => vec![NextAction::ResumeGoal { goal_id }],
            _ => Vec::new(),
        }
    }

    /// Who works next and how (the packet's `interaction_contract.mode`).
    pub fn interaction_mode(&self) -> InteractionMode {
        match self.route {
            TurnRoute::ReadyForHost => InteractionMode::BoundedDelivery,
            TurnRoute::UserActionRequired => InteractionMode::UserGate,
            TurnRoute::RepairRequired => InteractionMode::CapabilityRepair,
            TurnRoute::ReplanRequired => InteractionMode::AutonomousReplan,
            TurnRoute::Wait => InteractionMode::Wait,
            TurnRoute::Blocked | TurnRoute::ContractError => InteractionMode::Blocked,
        }
    }

    /// Whether a person must act before the agent can (the packet's `user_channel`).
    pub fn user_action_required(&self) -> bool {
        matches!(
            self.route,
            TurnRoute::UserActionRequired | TurnRoute::RepairRequired
        ) || (self.route == TurnRoute::Blocked && self.quota.state == QuotaState::Paused)
    }

    /// The compact JSON packet documented in docs/cli.md (`quota should-run`), except the
    /// rendered actions: `interaction_contract.cli_channel.next_cli_actions`/`next_cli_argv` and
    /// `user_channel.operator_cli_actions` are filled in by the front end from [`Self::next_actions`]
    /// and [`Self::operator_actions`] (the CLI: `cli::next_action::should_run_packet`).
    pub fn to_packet(&self) -> Value {
        let user_action_required = self.user_action_required();
        let mode = self.interaction_mode();
        let mut packet = json!({
            "schema_version": SHOULD_RUN_SCHEMA,
            "goal_id": self.goal_id,
            "agent_id": self.agent_id,
            "decision": if self.should_run() { "run" } else { "skip" },
            "should_run": self.should_run(),
            "route": self.route,
            "reason": self.reason,
            "selected_todo": self.selected_todo.as_ref().map(|s| json!({
                "id": s.todo.id,
                "title": s.todo.title,
                "priority": s.todo.priority,
                "status": s.todo.status,
                "capability": s.todo.capability,
                "lane": s.todo.lane,
                "selected_by": s.selected_by,
                "claim_key": s.claim_key,
                "claim_required_before_work": s.selected_by == SelectedBy::Ready,
            })),
            "quota": self.quota.to_json(),
            "interaction_contract": {
                "mode": mode,
                "user_channel": {
                    "action_required": user_action_required,
                    "notify": if user_action_required { "NOTIFY" } else { "DONT_NOTIFY" },
                    "items": self.blocking_gates.iter().chain(self.other_user_todos.iter()).map(|t| json!({
                        "todo_id": t.id, "kind": t.kind, "title": t.title, "blocks_this_agent": t.gate_blocks(&self.agent_id),
                    })).collect::<Vec<_>>(),
                },
                "agent_channel": {
                    "must_attempt": self.should_run(),
                    "primary_action": self.selected_todo.as_ref().map(|s| format!("{}: {}", s.todo.id, s.todo.title)),
                    "missing_capabilities": self.missing_capabilities,
                },
                "cli_channel": {
                    "spend_policy": "spend once, after the completed work is written back",
                },
            },
            "scheduler_hint": {
                "action": self.scheduler_action,
                "next_check_after_seconds": self.next_check_after_seconds,
            },
            "decided_at": rfc3339(self.decided_at),
        });
        // Only with a due monitor: packets without one keep the shape they always had.
        if let Some(m) = &self.monitor {
            packet["monitor"] = crate::kernel::projection::monitor_json(m, self.decided_at);
        }
        packet
    }
}

/// Capabilities provided by enabled extensions, as `<extension>/<capability>`.
pub(crate) fn installed_capabilities(tx: &dyn StoreRead) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for ext in tx.extensions()?.into_iter().filter(|e| e.enabled) {
        if let Some(provides) = ext.manifest.get("provides").and_then(Value::as_array) {
            for p in provides {
                if p.get("kind").and_then(Value::as_str) == Some("capability")
                    && let Some(id) = p.get("id").and_then(Value::as_str)
                {
                    out.push(format!("{}/{}", ext.id, id));
                }
            }
        }
    }
    Ok(out)
}

/// The installed capabilities, read from the registry the first time a goal needs them: most
/// goals bind no todo to an extension's capability, and the registry's join is one of the larger
/// statements a `should-run` would otherwise compile.
#[derive(Default)]
pub(crate) struct InstalledCapabilities(Option<Vec<String>>);

/// The capabilities the goal's live todos are bound to that no enabled extension provides
/// (`builtin:` ones always exist).
pub(crate) fn missing_capabilities(
    tx: &dyn StoreRead,
    goal_id: &str,
    installed: &mut InstalledCapabilities,
) -> Result<Vec<String>> {
    let mut missing = Vec::new();
    for c in tx.bound_capabilities(goal_id)? {
        if c.starts_with("builtin:") {
            continue;
        }
        let installed = match &mut installed.0 {
            Some(list) => list,
            empty => empty.insert(installed_capabilities(tx)?),
        };
        if !installed.contains(&c) {
            missing.push(c);
        }
    }
    Ok(missing)
}

/// Decides inside an existing snapshot (shared with the turn driver).
pub(crate) fn decide_in_tx(
    tx: &dyn StoreRead,
    goal_id: &str,
    agent_id: &str,
    now: i64,
) -> Result<Decision> {
    let goal = require_goal(tx, goal_id)?;
    let quota = view_in_tx(tx, goal_id, Some(agent_id), now)?;
    let user_todos = tx.open_user_todos(goal_id)?;
    let (blocking_gates, other_user_todos): (Vec<Todo>, Vec<Todo>) = user_todos
        .into_iter()
        .partition(|t| t.gate_blocks(agent_id));
    let missing_capabilities =
        missing_capabilities(tx, goal_id, &mut InstalledCapabilities::default())?;
    let mut d = Decision {
        goal_id: goal_id.to_string(),
        agent_id: agent_id.to_string(),
        route: TurnRoute::Wait,
        reason: String::new(),
        selected_todo: None,
        quota,
        blocking_gates,
        other_user_todos,
        missing_capabilities,
        scheduler_action: SchedulerAction::BackoffUntilStateChange,
        next_check_after_seconds: 300,
        decided_at: now,
        working_turn: None,
        monitor: None,
        wake_at: None,
    };
    let schedule = super::monitor::schedule_in_tx(tx, goal_id, now)?;
    // The earliest instant that can change this decision without a write: a monitor falling
    // due, a lease expiring, a deferred todo resuming (docs/cli.md, `scheduler_hint`). Read
    // only when the decision is to wait for one.
    let next_event = || -> Result<Option<i64>> {
        Ok([
            schedule.next_due_at,
            tx.next_lease_expiry(goal_id, now)?,
            tx.next_deferrals(goal_id, 1)?.first().map(|d| d.until_at),
        ]
        .into_iter()
        .flatten()
        .min())
    };
    let seconds_until = |t: i64| ((t - now).max(0) as u64).div_ceil(1000);
    let (route, reason, action, after): (TurnRoute, String, SchedulerAction, u64) = if goal.status
        == GoalStatus::Closed
    {
        (
            TurnRoute::Blocked,
            format!("goal '{goal_id}' is closed"),
            SchedulerAction::Stop,
            0,
        )
    } else if goal.status == GoalStatus::Paused {
        (
            TurnRoute::Blocked,
            format!("goal '{goal_id}' is paused by an operator"),
            SchedulerAction::BackoffUntilResumed,
            3600,
        )
    } else if d.quota.state == QuotaState::Paused {
        (
            TurnRoute::Blocked,
            format!(
                "{}: automatic agent turns are paused",
                d.quota.policy.why_no_slots().unwrap_or_default()
            ),
            SchedulerAction::BackoffUntilResumed,
            3600,
        )
    } else if !d.missing_capabilities.is_empty() {
        (
            TurnRoute::RepairRequired,
            format!(
                "open todos are bound to capabilities that are not installed and enabled: {}",
                d.missing_capabilities.join(", ")
            ),
            SchedulerAction::BackoffWaitingForUser,
            600,
        )
    } else if let Some(g) = d.blocking_gates.first() {
        (
            TurnRoute::UserActionRequired,
            format!(
                "gate '{}' (\"{}\") blocks agent '{agent_id}' until an operator resolves it",
                g.id, g.title
            ),
            SchedulerAction::BackoffWaitingForUser,
            600,
        )
    } else if let Some(due) = schedule.due.as_ref().filter(|m| m.monitor.probe.is_some()) {
        // A provider-backed check spends no quota and no agent turn: the heartbeat runs it.
        let reason = format!(
            "monitor '{}' is due: the heartbeat (loop watch or once) runs its probe",
            due.monitor.todo_id
        );
        d.monitor = Some(due.monitor.clone());
        (TurnRoute::Wait, reason, SchedulerAction::MonitorDue, 0)
    } else if d.quota.state != QuotaState::Eligible {
        let policy = &d.quota.policy;
        let after = tx
            .oldest_spend_since(goal_id, now - policy.window_ms())?
            .map(|t| ((t + policy.window_ms() - now).max(0) / 1000 + 1) as u64)
            .unwrap_or(60);
        // A running turn that settles without spending gives its slot back long before the
        // window frees one.
        let held = d.quota.reserved_slots + d.quota.agent_reserved_slots.unwrap_or(0);
        let after = if held > 0 {
            after.min(WAIT_FOR_TURN_SECONDS)
        } else {
            after
        };
        let running = match d.quota.reserved_slots {
            0 => String::new(),
            n => format!(", {n} more held by running turns"),
        };
        (
            TurnRoute::Wait,
            format!(
                "compute quota {}: {} of {} slots spent in the {}-hour window{running}",
                d.quota.state, d.quota.spent_slots, d.quota.allowed_slots, policy.window_hours
            ),
            SchedulerAction::WaitForQuota,
            after,
        )
    } else if let Some(held) = tx.claimed_by(goal_id, agent_id, now)? {
        if let Some((turn_key, _)) = tx.unsettled_turn_on(goal_id, &held.id)? {
            // A lease is worked by one live turn at a time: a second turn of the same agent (a
            // cron tick overlapping the previous one) waits instead of running its host on the
            // same fence.
            let reason = format!(
                "todo '{}' held by agent '{agent_id}' is being worked by turn '{turn_key}'; one turn works a lease at a time",
                held.id
            );
            d.working_turn = Some(turn_key);
            (
                TurnRoute::Wait,
                reason,
                SchedulerAction::WaitForTurn,
                WAIT_FOR_TURN_SECONDS,
            )
        } else {
            let key = held
                .claim
                .as_ref()
                .map(|c| c.idempotency_key.clone())
                .unwrap_or_default();
            let reason = format!("agent '{agent_id}' holds todo '{}'; continue it", held.id);
            d.selected_todo = Some(SelectedTodo {
                todo: held,
                selected_by: SelectedBy::CurrentClaim,
                claim_key: key,
            });
            (TurnRoute::ReadyForHost, reason, SchedulerAction::RunNow, 0)
        }
    } else if let Some(due) = schedule.due.as_ref() {
        // Monitors are checked before ordinary work. A turn on the monitor records its check
        // (`loopx todo check`); the check never completes it.
        let todo = super::require_todo(tx, goal_id, &due.monitor.todo_id)?;
        let reason = format!(
            "monitor '{}' is due: check it and record the observation (todo check)",
            todo.id
        );
        let key = format!("{agent_id}.{}.f{}", todo.id, todo.last_fence + 1);
        d.monitor = Some(due.monitor.clone());
        d.selected_todo = Some(SelectedTodo {
            todo,
            selected_by: SelectedBy::Ready,
            claim_key: key,
        });
        (
            TurnRoute::ReadyForHost,
            reason,
            SchedulerAction::MonitorDue,
            0,
        )
    } else if let Some(todo) = ready_work(tx, goal_id, now, schedule.active)? {
        let reason = format!(
            "todo '{}' [{}] is ready: {}",
            todo.id, todo.priority, todo.title
        );
        let key = format!("{agent_id}.{}.f{}", todo.id, todo.last_fence + 1);
        d.selected_todo = Some(SelectedTodo {
            todo,
            selected_by: SelectedBy::Ready,
            claim_key: key,
        });
        (TurnRoute::ReadyForHost, reason, SchedulerAction::RunNow, 0)
    } else {
        let counts = tx.todo_status_counts(goal_id)?;
        let pending: i64 = counts
            .iter()
            .filter(|(role, status, _)| {
                role == Role::Agent.as_str()
                    && TodoStatus::parse(status)
                        .map(|s| !s.is_terminal())
                        .unwrap_or(false)
            })
            .map(|c| c.2)
            .sum();
        // Scheduled monitors are agent todos that are never done: they are not pending work.
        let pending = pending - schedule.active;
        if pending > 0 {
            (
                TurnRoute::Wait,
                format!(
                    "{pending} agent todos remain but none is ready for '{agent_id}' (claimed by others, blocked, deferred or waiting on dependencies)"
                ),
                SchedulerAction::BackoffUntilStateChange,
                match next_event()? {
                    Some(t) if seconds_until(t) <= 300 => {
                        d.wake_at = Some(t);
                        seconds_until(t)
                    }
                    _ => 300,
                },
            )
        } else if schedule.active > 0 {
            let next_event = next_event()?;
            d.wake_at = next_event;
            let after = next_event.map_or(0, seconds_until);
            (
                TurnRoute::Wait,
                format!("only monitors remain and none is due; the next check is due in {after}s"),
                SchedulerAction::MonitorQuiet,
                after,
            )
        } else {
            (
                TurnRoute::ReplanRequired,
                "no open agent todos remain: add the next todos or let an operator close the goal"
                    .to_string(),
                SchedulerAction::BackoffUntilStateChange,
                300,
            )
        }
    };
    d.route = route;
    d.reason = reason;
    d.scheduler_action = action;
    d.next_check_after_seconds = after;
    Ok(d)
}

/// The best ready todo that is ordinary work: scheduled monitors are selected only when due (see
/// `monitor::schedule_in_tx`), so the ones that sort first in the ready queue are passed over. A
/// goal whose open agent todos are all monitors has none (one count, no todo read); otherwise the
/// queue is read in doubling batches until a todo that is not a monitor turns up.
fn ready_work(tx: &dyn StoreRead, goal_id: &str, now: i64, monitors: i64) -> Result<Option<Todo>> {
    let scheduled = |t: &Todo| -> Result<bool> {
        Ok(t.kind == crate::model::TodoKind::Monitor && tx.monitor(goal_id, &t.id)?.is_some())
    };
    let Some(first) = tx.ready_todos(goal_id, now, 1)?.pop() else {
        return Ok(None);
    };
    if !scheduled(&first)? {
        return Ok(Some(first));
    }
    let open_agent_todos: i64 = tx
        .todo_status_counts(goal_id)?
        .iter()
        .filter(|(role, status, _)| {
            role == Role::Agent.as_str()
                && TodoStatus::parse(status).is_ok_and(|s| !s.is_terminal())
        })
        .map(|c| c.2)
        .sum();
    if open_agent_todos <= monitors {
        return Ok(None);
    }
    let mut limit = 8usize;
    loop {
        let batch = tx.ready_todos(goal_id, now, limit)?;
        let exhausted = batch.len() < limit;
        for todo in batch {
            if !scheduled(&todo)? {
                return Ok(Some(todo));
            }
        }
        if exhausted || limit > monitors as usize {
            return Ok(None);
        }
        limit *= 2;
    }
}

/// What a claim without a todo id takes: what the decision hands an agent, a due monitor that
/// agents check first, then the best ready todo that is not a scheduled monitor. A monitor
/// that is not due, or that the heartbeat checks through a provider, is never taken this way.
pub(crate) fn next_claimable(tx: &dyn StoreRead, goal_id: &str, now: i64) -> Result<Option<Todo>> {
    let schedule = super::monitor::schedule_in_tx(tx, goal_id, now)?;
    if let Some(due) = schedule.due.as_ref().filter(|m| m.monitor.probe.is_none())
        && let Some(todo) = tx.todo(goal_id, &due.monitor.todo_id)?
    {
        return Ok(Some(todo));
    }
    ready_work(tx, goal_id, now, schedule.active)
}

/// Whether a ready todo is an agent's work now: any todo but a scheduled monitor; a scheduled
/// monitor only while due and checked by an agent (a provider-backed one is the heartbeat's).
pub(crate) fn is_agent_work_now(tx: &dyn StoreRead, todo: &Todo, now: i64) -> Result<bool> {
    if todo.kind != crate::model::TodoKind::Monitor {
        return Ok(true);
    }
    Ok(match tx.monitor(&todo.goal_id, &todo.id)? {
        None => true,
        Some(m) => {
            m.probe.is_none()
                && !m.expired(now)
                && m.due_at(todo.last_fence, todo.updated_at) <= now
        }
    })
}

impl Kernel {
    /// The decision for `agent_id` on `goal_id`. A pure read.
    pub fn should_run(&self, goal_id: &str, agent_id: &str) -> Result<Decision> {
        validate_token("agent id", agent_id)?;
        self.read(|tx| decide_in_tx(tx, goal_id, agent_id, now_ms()))
    }
}
