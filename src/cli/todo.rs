//! `loopx todo add|list|show|claim|renew|release|update|complete`.

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::Output;
use super::{Context, opt};
use crate::clock::{now_ms, rfc3339};
use crate::error::Result;
use crate::error::bad_input;
use crate::kernel::claim::{ClaimGrant, ClaimRequest, DEFAULT_TTL_SECONDS};
use crate::kernel::monitor::{CheckReport, MonitorPatch, MonitorSpec, Observation};
use crate::kernel::projection::monitor_json;
use crate::kernel::projection::{evidence_json, todo_json};
use crate::kernel::todo::{NewTodo, TodoChange, TodoPatch};
use crate::model::monitor::{parse_duration_ms, parse_until};
use crate::model::{
    GateScope, Monitor, MonitorFollowUp, Priority, ProbeSpec, Todo, TodoKind, TodoStatus,
};

// How an agent proves it holds a todo's lease. A plain comment: clap would show a doc comment here
// as the description of every command that flattens it.
#[derive(Debug, Args)]
pub struct AgentProof {
    /// The agent making the write (default: LOOPX_AGENT_ID; without either, the operator writes).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// The fence returned by `todo claim` (instead of --claim-key: one proof, not two to reconcile).
    #[arg(long, allow_hyphen_values = true, value_parser = super::flags::fence, conflicts_with = "claim_key")]
    pub fence: Option<i64>,
    /// The idempotency key the claim was made with (default: LOOPX_CLAIM_KEY).
    #[arg(long)]
    pub claim_key: Option<String>,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum TodoCommand {
    /// Add a todo (or a gate, with --kind user_gate/user_action).
    Add {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// What to do. A leading [P0]..[P4] sets the priority.
        #[arg(long, alias = "text")]
        title: String,
        /// Longer description of the work (free text).
        #[arg(long, default_value = "")]
        detail: String,
        /// P0 (most urgent) to P4; a leading [Pn] in the title sets it too.
        #[arg(long, value_parser = super::flags::wire::<Priority>())]
        priority: Option<Priority>,
        /// task, monitor, user_gate (an operator decision that blocks work) or user_action (a
        /// step only a person can take).
        #[arg(long, value_parser = super::flags::wire::<TodoKind>(), default_value = "task")]
        kind: TodoKind,
        /// Todo ids this one waits for; repeat for several.
        #[arg(long = "depends-on")]
        depends_on: Vec<String>,
        /// Capability a turn on this todo uses: <extension>/<capability> or builtin:default.
        #[arg(long, value_parser = super::flags::capability)]
        capability: Option<String>,
        /// Free-form lane label, for grouping todos that may run side by side.
        #[arg(long)]
        lane: Option<String>,
        /// Explicit todo id (default: t<N>).
        #[arg(long)]
        id: Option<String>,
        /// For a user_gate: the one agent it blocks.
        #[arg(long, conflicts_with = "global_gate")]
        blocks_agent: Option<String>,
        /// For a user_gate: block every agent on the goal.
        #[arg(long)]
        global_gate: bool,
        /// The agent adding it (recorded in the operation log).
        #[arg(long)]
        agent_id: Option<String>,
        #[command(flatten)]
        schedule: ScheduleArgs,
    },
    /// List a goal's todos.
    List {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// Only todos in this status.
        #[arg(long, value_parser = super::flags::wire::<TodoStatus>())]
        status: Option<TodoStatus>,
        /// Print the list again after every commit by any process (in place on a terminal)
        /// until Ctrl-C/SIGTERM or until stdout closes.
        #[arg(long)]
        watch: bool,
    },
    /// Show one todo with its evidence.
    Show {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The todo (its id within the goal, e.g. t1).
        #[arg(long)]
        todo_id: String,
    },
    /// Lease a todo (or, without --todo-id, the highest-priority ready one).
    Claim {
        /// The goal (default: the project's only active goal).
        #[arg(long)]
        goal_id: Option<String>,
        /// The todo to lease (default: the highest-priority ready one).
        #[arg(long)]
        todo_id: Option<String>,
        /// The agent taking the lease (default: LOOPX_AGENT_ID, then "agent").
        #[arg(long)]
        agent_id: Option<String>,
        /// Lease length in seconds (1..=86400).
        #[arg(long, default_value_t = DEFAULT_TTL_SECONDS, allow_hyphen_values = true, value_parser = super::flags::ttl_seconds)]
        ttl_seconds: u64,
        /// Names the claim: repeating it returns the same lease; it also proves the lease later.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Extend your lease.
    Renew {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The todo (its id within the goal, e.g. t1).
        #[arg(long)]
        todo_id: String,
        #[command(flatten)]
        proof: AgentProof,
        /// Lease length in seconds (1..=86400).
        #[arg(long, default_value_t = DEFAULT_TTL_SECONDS, allow_hyphen_values = true, value_parser = super::flags::ttl_seconds)]
        ttl_seconds: u64,
    },
    /// Give a claimed todo back.
    Release {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The todo (its id within the goal, e.g. t1).
        #[arg(long)]
        todo_id: String,
        #[command(flatten)]
        proof: AgentProof,
    },
    /// Change status, text or priority, and/or attach evidence.
    Update {
        /// The goal (default: the project's only active goal).
        #[arg(long)]
        goal_id: Option<String>,
        /// The todo (its id within the goal, e.g. t1).
        #[arg(long)]
        todo_id: String,
        /// New status (`claimed` is refused: a claim, which grants the lease, sets it).
        #[arg(long, value_parser = super::flags::wire::<TodoStatus>())]
        status: Option<TodoStatus>,
        /// Evidence of the work (a command and its result, a commit, a path); stored as given.
        #[arg(long)]
        evidence: Option<String>,
        /// New title of the todo.
        #[arg(long)]
        title: Option<String>,
        /// Longer description of the work (free text).
        #[arg(long)]
        detail: Option<String>,
        /// P0 (most urgent) to P4; a leading [Pn] in the title sets it too.
        #[arg(long, value_parser = super::flags::wire::<Priority>())]
        priority: Option<Priority>,
        /// Why the status changed (blocked/deferred).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        proof: AgentProof,
        #[command(flatten)]
        schedule: ScheduleArgs,
    },
    /// Mark a todo completed, with evidence.
    Complete {
        /// The goal (default: the project's only active goal).
        #[arg(long)]
        goal_id: Option<String>,
        /// The todo (its id within the goal, e.g. t1).
        #[arg(long)]
        todo_id: String,
        /// Evidence of the work (a command and its result, a commit, a path); stored as given.
        #[arg(long)]
        evidence: Option<String>,
        #[command(flatten)]
        proof: AgentProof,
    },
    /// Record a monitor check: the same observation as last time is a quiet check, a different
    /// one records evidence and opens the monitor's follow-up.
    Check {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The monitor todo.
        #[arg(long)]
        todo_id: String,
        /// What the check observed (compared by digest with the last check).
        #[arg(long, required_unless_present = "failed")]
        observation: Option<String>,
        /// The check could not observe: why (recorded as a failed check, retried next cadence).
        #[arg(long, conflicts_with = "observation")]
        failed: Option<String>,
        #[command(flatten)]
        proof: AgentProof,
    },
}

pub(crate) fn todo_row(t: &Todo, now: i64) -> Vec<String> {
    let claim = t
        .live_claim(now)
        .map(|c| format!("{} f{}", c.agent_id, c.fence))
        .unwrap_or_else(|| "-".into());
    vec![
        t.id.clone(),
        t.priority.to_string(),
        t.kind.to_string(),
        t.status.to_string(),
        claim,
        t.title.clone(),
    ]
}

fn todo_output(heading: &str, t: &Todo) -> Output {
    let now = now_ms();
    Output::new(json!({"todo": todo_json(t, now)}))
        .heading(format!("{heading} {}", t.id))
        .fields([
            ("goal", t.goal_id.clone()),
            ("title", t.title.clone()),
            ("status", t.status.to_string()),
            ("priority", t.priority.to_string()),
            ("kind", t.kind.to_string()),
            (
                "depends on",
                if t.depends_on.is_empty() {
                    "-".to_string()
                } else {
                    t.depends_on.join(", ")
                },
            ),
            (
                "claim",
                t.live_claim(now)
                    .map(|c| format!("{} (fence {})", c.agent_id, c.fence))
                    .unwrap_or_else(|| "-".into()),
            ),
        ])
}

fn change_output(heading: &str, change: &TodoChange) -> Output {
    let mut out = todo_output(heading, &change.todo);
    out.value["changed"] = json!(change.changed);
    out.value["evidence_id"] = json!(change.evidence_id);
    if !change.changed {
        out = out.para("(no change: already in that state)");
    }
    out
}

/// A granted lease: `heading` says whether a claim or a renewal granted it.
fn grant_output(heading: &str, grant: &ClaimGrant) -> Output {
    let c = &grant.claim;
    let mut out = todo_output(heading, &grant.todo);
    out.value["claim"] = json!({
        "agent_id": c.agent_id,
        "fence": c.fence,
        "claim_key": c.idempotency_key,
        "expires_at": rfc3339(c.expires_at),
        "replayed": grant.replayed,
        "took_over_from": grant.took_over_from,
    });
    out.fields([
        ("fence", c.fence.to_string()),
        ("claim key", c.idempotency_key.clone()),
        ("expires", rfc3339(c.expires_at)),
        ("replayed", grant.replayed.to_string()),
        ("took over from", opt(&grant.took_over_from)),
    ])
}

/// `todo list`: a goal's todos, optionally of one status (also each redraw of `--watch`).
fn list(
    kernel: &crate::kernel::Kernel,
    goal_id: &str,
    status: Option<TodoStatus>,
) -> Result<Output> {
    let now = now_ms();
    let todos: Vec<Todo> = kernel
        .todos(goal_id)?
        .into_iter()
        .filter(|t| status.is_none_or(|s| t.status == s))
        .collect();
    let monitors = kernel.monitors(goal_id)?;
    let out = Output::new(json!({"goal_id": goal_id, "todos": todos.iter().map(|t| todo_json(t, now)).collect::<Vec<_>>()}))
        .heading(format!("{} todo(s) in {goal_id}", todos.len()))
        .table(&["id", "pri", "kind", "status", "claim", "title"], todos.iter().map(|t| todo_row(t, now)).collect());
    Ok(with_monitor_list(out, &todos, &monitors, now))
}

pub fn run(ctx: &Context, cmd: TodoCommand) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    match cmd {
        TodoCommand::Add {
            goal_id,
            title,
            detail,
            priority,
            kind,
            depends_on,
            capability,
            lane,
            id,
            blocks_agent,
            global_gate,
            agent_id,
            schedule,
        } => {
            let gate_scope = match (blocks_agent, global_gate) {
                (Some(agent_id), _) => Some(GateScope::BlocksAgent { agent_id }),
                (None, true) => Some(GateScope::Global),
                (None, false) => None,
            };
            let new = NewTodo {
                id,
                title,
                detail,
                priority,
                kind,
                depends_on,
                capability,
                lane,
                gate_scope,
            };
            let actor = ctx.actor(agent_id.as_deref(), None, None);
            if kind == TodoKind::Monitor || !schedule.is_empty() {
                let spec = schedule.spec()?;
                let (todo, monitor) = kernel.add_monitor(&actor, &goal_id, new, spec)?;
                return Ok(with_monitor(todo_output("Added", &todo), Some(&monitor)));
            }
            let todo = kernel.add_todo(&actor, &goal_id, new)?;
            Ok(todo_output("Added", &todo))
        }
        TodoCommand::List {
            goal_id,
            status,
            watch: true,
        } => super::watch::run(ctx, &mut kernel, |k| list(k, &goal_id, status)),
        TodoCommand::List {
            goal_id, status, ..
        } => list(&kernel, &goal_id, status),
        TodoCommand::Show { goal_id, todo_id } => {
            let (todo, evidence) = kernel.todo(&goal_id, &todo_id)?;
            let mut out = with_schedule(&kernel, todo_output("Todo", &todo), &todo)?;
            out.value["evidence"] = json!(evidence.iter().map(evidence_json).collect::<Vec<_>>());
            let rows = evidence
                .iter()
                .map(|e| vec![rfc3339(e.created_at), e.actor.clone(), e.text.clone()])
                .collect();
            Ok(out
                .heading("Evidence")
                .table(&["when", "actor", "text"], rows))
        }
        TodoCommand::Claim {
            goal_id,
            todo_id,
            agent_id,
            ttl_seconds,
            idempotency_key,
        } => {
            let req = ClaimRequest {
                goal_id: ctx.goal_id(&kernel, goal_id)?,
                todo_id,
                agent_id: ctx.agent_id(agent_id.as_deref()),
                ttl_seconds,
                idempotency_key,
            };
            Ok(grant_output("Claimed", &kernel.claim(&req)?))
        }
        TodoCommand::Renew {
            goal_id,
            todo_id,
            proof,
            ttl_seconds,
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            Ok(grant_output(
                "Renewed",
                &kernel.renew(&actor, &goal_id, &todo_id, ttl_seconds)?,
            ))
        }
        TodoCommand::Release {
            goal_id,
            todo_id,
            proof,
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            let change = kernel.release(&actor, &goal_id, &todo_id)?;
            if change.changed {
                Ok(change_output("Released", &change))
            } else {
                let mut out = todo_output("Not claimed, nothing released:", &change.todo);
                out.value["changed"] = json!(false);
                out.value["evidence_id"] = json!(null);
                Ok(out)
            }
        }
        TodoCommand::Update {
            goal_id,
            todo_id,
            status,
            evidence,
            title,
            detail,
            priority,
            reason,
            proof,
            schedule,
        } => {
            let goal_id = ctx.goal_id(&kernel, goal_id)?;
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            let patch = TodoPatch {
                status,
                title,
                detail,
                priority,
                evidence,
                reason,
                until: schedule.until_at()?,
                monitor: schedule.patch()?,
            };
            let change = kernel.update_todo(&actor, &goal_id, &todo_id, patch)?;
            with_schedule(&kernel, change_output("Updated", &change), &change.todo)
        }
        TodoCommand::Complete {
            goal_id,
            todo_id,
            evidence,
            proof,
        } => {
            let goal_id = ctx.goal_id(&kernel, goal_id)?;
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            Ok(change_output(
                "Completed",
                &kernel.complete_todo(&actor, &goal_id, &todo_id, evidence.as_deref())?,
            ))
        }
        TodoCommand::Check {
            goal_id,
            todo_id,
            observation,
            failed,
            proof,
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            let observed = match (observation, failed) {
                (Some(text), _) => Observation::Value(text),
                (None, Some(reason)) => Observation::Failed(reason),
                (None, None) => {
                    return Err(bad_input("pass --observation TEXT or --failed REASON"));
                }
            };
            let report = kernel.record_check(&actor, &goal_id, &todo_id, &observed, None)?;
            Ok(check_output(&report))
        }
    }
}

// The schedule flags of `todo add` (a monitor's) and `todo update` (a monitor's, or `--until` of a
// deferred todo). A plain comment: clap would show a doc comment here as the description of both
// commands.
#[derive(Debug, Args, Default)]
pub struct ScheduleArgs {
    /// Monitors: how often the check runs, e.g. 30s, 15m, 1h, 1d (a new monitor needs it).
    #[arg(long, allow_hyphen_values = true, value_parser = cadence)]
    pub every: Option<std::time::Duration>,
    /// Monitors: when the monitor ends; deferred todos: when they resume. RFC 3339 UTC
    /// (2026-12-02T05:00:00Z) or +<duration> from now (+2h).
    // Hyphen values reach the parser, which says what a time looks like: `--until -1h` is a time
    // in the past, not a flag.
    #[arg(long, allow_hyphen_values = true)]
    pub until: Option<String>,
    /// Monitors: what is watched (a metric key, a path, a URL), shown to the agent.
    #[arg(long)]
    pub target: Option<String>,
    /// Monitors: a material change records evidence only, no follow-up todo.
    #[arg(long, conflicts_with = "on_change")]
    pub watch_only: bool,
    /// Monitors: what a material change opens: open_todo (an agent todo, default), replan, or
    /// none (evidence only, as --watch-only).
    #[arg(long, value_parser = super::flags::wire::<MonitorFollowUp>())]
    pub on_change: Option<MonitorFollowUp>,
    /// Monitors: quiet checks in a row before the cadence backs off (x2, x4, x8; default 3).
    #[arg(long, allow_hyphen_values = true, value_parser = super::flags::max_no_change)]
    pub max_no_change: Option<i64>,
    /// Monitors: run a provider operation as the check, with no agent turn:
    /// --probe <extension>/<provider> <operation> <target>.
    #[arg(long, num_args = 3, value_names = ["PROVIDER", "OPERATION", "TARGET"])]
    pub probe: Vec<String>,
}

impl ScheduleArgs {
    fn is_empty(&self) -> bool {
        self.every.is_none()
            && self.until.is_none()
            && self.target.is_none()
            && !self.watch_only
            && self.on_change.is_none()
            && self.max_no_change.is_none()
            && self.probe.is_empty()
    }

    fn until_at(&self) -> Result<Option<i64>> {
        self.until
            .as_deref()
            .map(|u| parse_until(u, now_ms()))
            .transpose()
    }

    fn follow_up(&self) -> Option<MonitorFollowUp> {
        if self.watch_only {
            Some(MonitorFollowUp::None)
        } else {
            self.on_change
        }
    }

    fn probe(&self) -> Option<ProbeSpec> {
        match self.probe.as_slice() {
            [provider, operation, target] => Some(ProbeSpec {
                provider: provider.clone(),
                operation: operation.clone(),
                target: target.clone(),
            }),
            _ => None,
        }
    }

    fn spec(&self) -> Result<MonitorSpec> {
        let every = self
            .every
            .ok_or_else(|| bad_input("a monitor needs a cadence: pass --every, e.g. --every 1h"))?;
        let mut spec = MonitorSpec::every(every.as_millis() as i64);
        spec.until_at = self.until_at()?;
        spec.target = self.target.clone();
        spec.follow_up = self.follow_up().unwrap_or(MonitorFollowUp::OpenTodo);
        if let Some(n) = self.max_no_change {
            spec.max_no_change = n;
        }
        spec.probe = self.probe();
        Ok(spec)
    }

    fn patch(&self) -> Result<MonitorPatch> {
        Ok(MonitorPatch {
            every_ms: self.every.map(|d| d.as_millis() as i64),
            until_at: None,
            target: self.target.clone(),
            follow_up: self.follow_up(),
            max_no_change: self.max_no_change,
            probe: self.probe(),
        })
    }
}

/// `--every`: a duration text (`30s`, `1h30m`), so it is a shaped text flag, not a number.
fn cadence(text: &str) -> Result<std::time::Duration> {
    parse_duration_ms(text).map(|ms| std::time::Duration::from_millis(ms as u64))
}

fn monitor_fields(m: &Monitor, now: i64) -> Vec<(&'static str, String)> {
    let ms = |v: i64| format!("{}s", v / 1000);
    vec![
        ("every", ms(m.every_ms)),
        (
            "interval now",
            format!(
                "{} (x{} after {} quiet checks)",
                ms(m.interval_ms()),
                m.backoff_factor(),
                m.no_change_count
            ),
        ),
        ("next due", rfc3339(m.next_due_at)),
        (
            "due now",
            (m.next_due_at <= now && !m.expired(now)).to_string(),
        ),
        (
            "until",
            m.until_at.map(rfc3339).unwrap_or_else(|| "-".into()),
        ),
        (
            "last check",
            m.last_check_at.map(rfc3339).unwrap_or_else(|| "-".into()),
        ),
        (
            "last result",
            m.last_result
                .map(|r| r.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        ("last digest", opt(&m.last_digest)),
        ("target", opt(&m.target)),
        ("on change", m.follow_up.to_string()),
        (
            "probe",
            m.probe
                .as_ref()
                .map(|p| format!("{} {} {}", p.provider, p.operation, p.target))
                .unwrap_or_else(|| "-".into()),
        ),
        ("last failure", opt(&m.last_failure)),
    ]
}

/// `out` with the todo's schedule, as `todo show` prints it: a monitor's block, a deferred todo's
/// resume time. Read only for the todos that can have one, so a plain todo costs no read.
fn with_schedule(kernel: &crate::kernel::Kernel, out: Output, todo: &Todo) -> Result<Output> {
    let mut out = if todo.kind == TodoKind::Monitor {
        with_monitor(out, kernel.monitor(&todo.goal_id, &todo.id)?.as_ref())
    } else {
        out
    };
    if todo.status == TodoStatus::Deferred
        && let Some(at) = kernel.deferral(&todo.goal_id, &todo.id)?
    {
        out.value["todo"]["resumes_at"] = json!(rfc3339(at));
        out = out.fields([("resumes at", rfc3339(at))]);
    }
    Ok(out)
}

fn with_monitor(mut out: Output, monitor: Option<&Monitor>) -> Output {
    let Some(m) = monitor else { return out };
    let now = now_ms();
    out.value["todo"]["monitor"] = monitor_json(m, now);
    out.fields(monitor_fields(m, now))
}

fn with_monitor_list(mut out: Output, todos: &[Todo], monitors: &[Monitor], now: i64) -> Output {
    if monitors.is_empty() {
        return out;
    }
    if let Some(list) = out.value["todos"].as_array_mut() {
        for (item, todo) in list.iter_mut().zip(todos) {
            if let Some(m) = monitors.iter().find(|m| m.todo_id == todo.id) {
                item["monitor"] = monitor_json(m, now);
            }
        }
    }
    let rows = monitors
        .iter()
        .filter(|m| todos.iter().any(|t| t.id == m.todo_id))
        .map(|m| {
            vec![
                m.todo_id.clone(),
                format!("{}s", m.every_ms / 1000),
                rfc3339(m.next_due_at),
                m.last_check_at.map(rfc3339).unwrap_or_else(|| "-".into()),
                m.last_result
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| "-".into()),
                m.no_change_count.to_string(),
                m.last_digest
                    .as_deref()
                    .map(|d| d[..12.min(d.len())].to_string())
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    out.heading("Monitors").table(
        &[
            "id",
            "every",
            "next due",
            "last check",
            "result",
            "quiet",
            "digest",
        ],
        rows,
    )
}

fn check_output(report: &CheckReport) -> Output {
    let m = &report.monitor;
    Output::new(json!({
        "check": {
            "goal_id": m.goal_id,
            "todo_id": m.todo_id,
            "result": report.result,
            "digest": report.digest,
            "evidence_id": report.evidence_id,
            "follow_up_todo": report.follow_up_todo,
            "monitor": monitor_json(m, now_ms()),
        }
    }))
    .heading(format!("Check of monitor {}: {}", m.todo_id, report.result))
    .fields([
        ("next due", rfc3339(m.next_due_at)),
        ("quiet checks", m.no_change_count.to_string()),
        ("follow-up todo", opt(&report.follow_up_todo)),
    ])
}
