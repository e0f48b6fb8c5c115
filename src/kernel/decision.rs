//! `quota should-run`: the pure decision of what this agent may do next on a goal.
//!
//! It reads one snapshot and writes nothing (the reference appended an event on every call). The
//! decision is one typed route plus the exact CLI commands that carry it out, so an agent host can
//! execute the packet without interpreting prose.

use serde::Serialize;
use serde_json::{Value, json};

use super::quota::{QuotaView, view_in_tx};
use super::{Kernel, require_goal};
use crate::clock::{now_ms, rfc3339};
use crate::error::Result;
use crate::ids::validate_token;
use crate::model::{GoalStatus, Role, Todo, TodoStatus, wire_enum};
use crate::store::StoreRead;

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

/// Why a todo was selected.
#[derive(Debug, Clone, Serialize)]
pub struct SelectedTodo {
    pub todo: Todo,
    /// `current_claim` (the agent already holds it) or `ready` (best unclaimed ready todo).
    pub selected_by: &'static str,
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
    pub scheduler_action: &'static str,
    pub next_check_after_seconds: u64,
    pub decided_at: i64,
    /// The live turn already working the lease this agent holds (route `wait`).
    pub working_turn: Option<String>,
}

/// How long a second turn of the same agent waits before deciding again while the first one
/// works the lease. Turns take seconds to minutes; polling every few seconds costs one read.
pub const WAIT_FOR_TURN_SECONDS: u64 = 5;

impl Decision {
    pub fn should_run(&self) -> bool {
        self.route == TurnRoute::ReadyForHost
    }

    /// The commands the agent should run next, as argv vectors.
    pub fn next_cli_argv(&self) -> Vec<Vec<String>> {
        let g = &self.goal_id;
        let a = &self.agent_id;
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        match self.route {
            TurnRoute::ReadyForHost => {
                let sel = self
                    .selected_todo
                    .as_ref()
                    .expect("ready routes select a todo");
                let t = &sel.todo.id;
                let k = &sel.claim_key;
                let mut out = Vec::new();
                if sel.selected_by == "ready" {
                    out.push(s(&[
                        "loopx",
                        "todo",
                        "claim",
                        "--goal-id",
                        g,
                        "--todo-id",
                        t,
                        "--agent-id",
                        a,
                        "--idempotency-key",
                        k,
                    ]));
                }
                out.push(s(&[
                    "loopx",
                    "todo",
                    "complete",
                    "--goal-id",
                    g,
                    "--todo-id",
                    t,
                    "--agent-id",
                    a,
                    "--claim-key",
                    k,
                    "--evidence",
                    "<what changed and how it was checked>",
                ]));
                out.push(s(&[
                    "loopx",
                    "refresh-state",
                    "--goal-id",
                    g,
                    "--agent-id",
                    a,
                    "--todo-id",
                    t,
                ]));
                out.push(s(&[
                    "loopx",
                    "quota",
                    "spend-slot",
                    "--goal-id",
                    g,
                    "--agent-id",
                    a,
                ]));
                out
            }
            TurnRoute::ReplanRequired => vec![s(&[
                "loopx",
                "todo",
                "add",
                "--goal-id",
                g,
                "--agent-id",
                a,
                "--title",
                "<the next bounded step toward the objective>",
            ])],
            _ => Vec::new(),
        }
    }

    /// Commands only an operator can run to unblock this decision.
    pub fn operator_cli_actions(&self) -> Vec<String> {
        let g = &self.goal_id;
        match self.route {
            TurnRoute::UserActionRequired => self
                .blocking_gates
                .iter()
                .map(|t| {
                    format!(
                        "loopx gate resolve --goal-id {g} --todo-id {} --comment \"<decision>\"",
                        t.id
                    )
                })
                .collect(),
            TurnRoute::RepairRequired => vec![
                "loopx extension list".to_string(),
                format!("loopx todo list --goal-id {g}"),
            ],
            TurnRoute::Blocked if self.quota.state == "paused" => {
                vec![format!("loopx quota set --goal-id {g} --compute 1")]
            }
            TurnRoute::Blocked => vec![format!("loopx goal resume --goal-id {g}")],
            _ => Vec::new(),
        }
    }

    /// The compact JSON packet `quota should-run` prints (docs/cli.md, "Quota and the decision").
    pub fn to_packet(&self) -> Value {
        let argv = self.next_cli_argv();
        let commands: Vec<String> = argv.iter().map(|a| shell_join(a)).collect();
        let user_action_required = matches!(
            self.route,
            TurnRoute::UserActionRequired | TurnRoute::RepairRequired
        ) || (self.route == TurnRoute::Blocked
            && self.quota.state == "paused");
        let mode = match self.route {
            TurnRoute::ReadyForHost => "bounded_delivery",
            TurnRoute::UserActionRequired => "user_gate",
            TurnRoute::RepairRequired => "capability_repair",
            TurnRoute::ReplanRequired => "autonomous_replan",
            TurnRoute::Wait => "wait",
            TurnRoute::Blocked | TurnRoute::ContractError => "blocked",
        };
        json!({
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
                "claim_required_before_work": s.selected_by == "ready",
            })),
            "quota": {
                "allowed_slots": self.quota.allowed_slots,
                "spent_slots": self.quota.spent_slots,
                "remaining_slots": self.quota.remaining_slots,
                "agent_spent_slots": self.quota.agent_spent_slots,
                "state": self.quota.state,
            },
            "interaction_contract": {
                "mode": mode,
                "user_channel": {
                    "action_required": user_action_required,
                    "notify": if user_action_required { "NOTIFY" } else { "DONT_NOTIFY" },
                    "items": self.blocking_gates.iter().chain(self.other_user_todos.iter()).map(|t| json!({
                        "todo_id": t.id, "kind": t.kind, "title": t.title, "blocks_this_agent": t.gate_blocks(&self.agent_id),
                    })).collect::<Vec<_>>(),
                    "operator_cli_actions": self.operator_cli_actions(),
                },
                "agent_channel": {
                    "must_attempt": self.should_run(),
                    "primary_action": self.selected_todo.as_ref().map(|s| format!("{}: {}", s.todo.id, s.todo.title)),
                    "missing_capabilities": self.missing_capabilities,
                },
                "cli_channel": {
                    "next_cli_actions": commands,
                    "next_cli_argv": argv,
                    "spend_policy": "spend once, after the completed work is written back",
                },
            },
            "scheduler_hint": {
                "action": self.scheduler_action,
                "next_check_after_seconds": self.next_check_after_seconds,
            },
            "decided_at": rfc3339(self.decided_at),
        })
    }
}

/// Joins argv into one shell-safe line (single quotes where needed).
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
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
    let installed = installed_capabilities(tx)?;
    let missing_capabilities: Vec<String> = tx
        .bound_capabilities(goal_id)?
        .into_iter()
        .filter(|c| !c.starts_with("builtin:") && !installed.contains(c))
        .collect();
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
        scheduler_action: "backoff_until_state_change",
        next_check_after_seconds: 300,
        decided_at: now,
        working_turn: None,
    };
    let (route, reason, action, after): (TurnRoute, String, &'static str, u64) = if goal.status
        == GoalStatus::Closed
    {
        (
            TurnRoute::Blocked,
            format!("goal '{goal_id}' is closed"),
            "stop",
            0,
        )
    } else if goal.status == GoalStatus::Paused {
        (
            TurnRoute::Blocked,
            format!("goal '{goal_id}' is paused by an operator"),
            "backoff_until_resumed",
            3600,
        )
    } else if d.quota.state == "paused" {
        (
            TurnRoute::Blocked,
            "compute quota is 0: automatic agent turns are paused".to_string(),
            "backoff_until_resumed",
            3600,
        )
    } else if !d.missing_capabilities.is_empty() {
        (
            TurnRoute::RepairRequired,
            format!(
                "open todos are bound to capabilities that are not installed and enabled: {}",
                d.missing_capabilities.join(", ")
            ),
            "backoff_waiting_for_user",
            600,
        )
    } else if let Some(g) = d.blocking_gates.first() {
        (
            TurnRoute::UserActionRequired,
            format!(
                "gate '{}' (\"{}\") blocks agent '{agent_id}' until an operator resolves it",
                g.id, g.title
            ),
            "backoff_waiting_for_user",
            600,
        )
    } else if d.quota.state != "eligible" {
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
            "wait_for_quota",
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
                "wait_for_turn",
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
                selected_by: "current_claim",
                claim_key: key,
            });
            (TurnRoute::ReadyForHost, reason, "run_now", 0)
        }
    } else if let Some(todo) = tx.ready_todos(goal_id, now, 1)?.pop() {
        let reason = format!(
            "todo '{}' [{}] is ready: {}",
            todo.id, todo.priority, todo.title
        );
        let key = format!("{agent_id}.{}.f{}", todo.id, todo.last_fence + 1);
        d.selected_todo = Some(SelectedTodo {
            todo,
            selected_by: "ready",
            claim_key: key,
        });
        (TurnRoute::ReadyForHost, reason, "run_now", 0)
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
        if pending > 0 {
            (
                TurnRoute::Wait,
                format!(
                    "{pending} agent todos remain but none is ready for '{agent_id}' (claimed by others, blocked, deferred or waiting on dependencies)"
                ),
                "backoff_until_state_change",
                300,
            )
        } else {
            (
                TurnRoute::ReplanRequired,
                "no open agent todos remain: add the next todos or let an operator close the goal"
                    .to_string(),
                "backoff_until_state_change",
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

impl Kernel {
    /// The decision for `agent_id` on `goal_id`. A pure read.
    pub fn should_run(&mut self, goal_id: &str, agent_id: &str) -> Result<Decision> {
        validate_token("agent id", agent_id)?;
        self.read(|tx| decide_in_tx(tx, goal_id, agent_id, now_ms()))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_join;

    #[test]
    fn shell_quoting() {
        let argv = vec![
            "loopx".to_string(),
            "--evidence".to_string(),
            "it's done".to_string(),
        ];
        assert_eq!(shell_join(&argv), r"loopx --evidence 'it'\''s done'");
    }
}
