//! `loopx todo add|list|show|claim|renew|release|update|complete`.

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::Output;
use super::{Context, opt};
use crate::clock::{now_ms, rfc3339};
use crate::error::Result;
use crate::kernel::claim::{ClaimGrant, ClaimRequest, DEFAULT_TTL_SECONDS};
use crate::kernel::projection::{evidence_json, todo_json};
use crate::kernel::todo::{NewTodo, TodoChange, TodoPatch};
use crate::model::{GateScope, Priority, Todo, TodoKind, TodoStatus};

/// How an agent proves it holds a todo's lease.
#[derive(Debug, Args)]
pub struct AgentProof {
    /// The agent making the write (default: LOOPX_AGENT_ID; without either, the operator writes).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// The fence returned by `todo claim`.
    #[arg(long, allow_hyphen_values = true, value_parser = super::flags::fence)]
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
        #[arg(long)]
        goal_id: String,
        /// What to do. A leading [P0]..[P4] sets the priority.
        #[arg(long, alias = "text")]
        title: String,
        #[arg(long, default_value = "")]
        detail: String,
        #[arg(long, value_parser = Priority::parse)]
        priority: Option<Priority>,
        #[arg(long, value_parser = TodoKind::parse, default_value = "task")]
        kind: TodoKind,
        /// Todo ids this one waits for; repeat for several.
        #[arg(long = "depends-on")]
        depends_on: Vec<String>,
        #[arg(long, value_parser = super::flags::capability)]
        capability: Option<String>,
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
    },
    /// List a goal's todos.
    List {
        #[arg(long)]
        goal_id: String,
        #[arg(long, value_parser = TodoStatus::parse)]
        status: Option<TodoStatus>,
    },
    /// Show one todo with its evidence.
    Show {
        #[arg(long)]
        goal_id: String,
        #[arg(long)]
        todo_id: String,
    },
    /// Lease a todo (or, without --todo-id, the highest-priority ready one).
    Claim {
        #[arg(long)]
        goal_id: String,
        #[arg(long)]
        todo_id: Option<String>,
        #[arg(long)]
        agent_id: Option<String>,
        #[arg(long, default_value_t = DEFAULT_TTL_SECONDS, allow_hyphen_values = true, value_parser = super::flags::ttl_seconds)]
        ttl_seconds: u64,
        /// Names the claim: repeating it returns the same lease; it also proves the lease later.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Extend your lease.
    Renew {
        #[arg(long)]
        goal_id: String,
        #[arg(long)]
        todo_id: String,
        #[command(flatten)]
        proof: AgentProof,
        #[arg(long, default_value_t = DEFAULT_TTL_SECONDS, allow_hyphen_values = true, value_parser = super::flags::ttl_seconds)]
        ttl_seconds: u64,
    },
    /// Give a claimed todo back.
    Release {
        #[arg(long)]
        goal_id: String,
        #[arg(long)]
        todo_id: String,
        #[command(flatten)]
        proof: AgentProof,
    },
    /// Change status, text or priority, and/or attach evidence.
    Update {
        #[arg(long)]
        goal_id: String,
        #[arg(long)]
        todo_id: String,
        #[arg(long, value_parser = TodoStatus::parse)]
        status: Option<TodoStatus>,
        #[arg(long)]
        evidence: Option<String>,
        #[arg(long)]
        title: Option<String>,
        #[arg(long)]
        detail: Option<String>,
        #[arg(long, value_parser = Priority::parse)]
        priority: Option<Priority>,
        /// Why the status changed (blocked/deferred).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        proof: AgentProof,
    },
    /// Mark a todo completed, with evidence.
    Complete {
        #[arg(long)]
        goal_id: String,
        #[arg(long)]
        todo_id: String,
        #[arg(long)]
        evidence: Option<String>,
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

fn grant_output(grant: &ClaimGrant) -> Output {
    let c = &grant.claim;
    let mut out = todo_output("Claimed", &grant.todo);
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
            let todo =
                kernel.add_todo(&ctx.actor(agent_id.as_deref(), None, None), &goal_id, new)?;
            Ok(todo_output("Added", &todo))
        }
        TodoCommand::List { goal_id, status } => {
            let now = now_ms();
            let todos: Vec<Todo> = kernel
                .todos(&goal_id)?
                .into_iter()
                .filter(|t| status.is_none_or(|s| t.status == s))
                .collect();
            Ok(Output::new(json!({"goal_id": goal_id, "todos": todos.iter().map(|t| todo_json(t, now)).collect::<Vec<_>>()}))
                .heading(format!("{} todo(s) in {goal_id}", todos.len()))
                .table(&["id", "pri", "kind", "status", "claim", "title"], todos.iter().map(|t| todo_row(t, now)).collect()))
        }
        TodoCommand::Show { goal_id, todo_id } => {
            let (todo, evidence) = kernel.todo(&goal_id, &todo_id)?;
            let mut out = todo_output("Todo", &todo);
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
                goal_id,
                todo_id,
                agent_id: ctx.agent_id(agent_id.as_deref()),
                ttl_seconds,
                idempotency_key,
            };
            Ok(grant_output(&kernel.claim(&req)?))
        }
        TodoCommand::Renew {
            goal_id,
            todo_id,
            proof,
            ttl_seconds,
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            Ok(grant_output(&kernel.renew(
                &actor,
                &goal_id,
                &todo_id,
                ttl_seconds,
            )?))
        }
        TodoCommand::Release {
            goal_id,
            todo_id,
            proof,
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            Ok(todo_output(
                "Released",
                &kernel.release(&actor, &goal_id, &todo_id)?,
            ))
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
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            let patch = TodoPatch {
                status,
                title,
                detail,
                priority,
                evidence,
                reason,
            };
            Ok(change_output(
                "Updated",
                &kernel.update_todo(&actor, &goal_id, &todo_id, patch)?,
            ))
        }
        TodoCommand::Complete {
            goal_id,
            todo_id,
            evidence,
            proof,
        } => {
            let actor = ctx.actor(proof.agent_id.as_deref(), proof.fence, proof.claim_key);
            Ok(change_output(
                "Completed",
                &kernel.complete_todo(&actor, &goal_id, &todo_id, evidence.as_deref())?,
            ))
        }
    }
}
