//! `loopx gate list|resolve`: user gates and user actions. Only operators resolve them.

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::output::Output;
use crate::clock::now_ms;
use crate::error::Result;
use crate::kernel::projection::todo_json;
use crate::model::GateScope;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum GateCommand {
    /// Open gates and user actions of a goal.
    List {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
    /// Resolve a gate (approve by default, or --reject). Refused inside an agent turn.
    Resolve {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The todo (its id within the goal, e.g. t1).
        #[arg(long)]
        todo_id: String,
        /// Reject instead of approve: the gate is archived and work depending on it stays held.
        #[arg(long)]
        reject: bool,
        /// Why it was approved or rejected (recorded with the resolution).
        #[arg(long)]
        comment: Option<String>,
    },
}

pub fn run(ctx: &Context, cmd: GateCommand) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    match cmd {
        GateCommand::List { goal_id } => {
            let gates = kernel.gates(&goal_id)?;
            let now = now_ms();
            let rows = gates
                .iter()
                .map(|g| {
                    let scope = match &g.gate_scope {
                        Some(GateScope::BlocksAgent { agent_id }) => format!("blocks {agent_id}"),
                        Some(GateScope::Global) => "blocks all agents".to_string(),
                        None => "informs".to_string(),
                    };
                    vec![g.id.clone(), g.kind.to_string(), scope, g.title.clone()]
                })
                .collect();
            Ok(Output::new(json!({"goal_id": goal_id, "gates": gates.iter().map(|g| todo_json(g, now)).collect::<Vec<_>>()}))
                .heading(format!("{} open gate(s) and user action(s) in {goal_id}", gates.len()))
                .table(&["id", "kind", "scope", "title"], rows))
        }
        GateCommand::Resolve {
            goal_id,
            todo_id,
            reject,
            comment,
        } => {
            let change = kernel.resolve_gate(
                &ctx.operator_or_agent(),
                &goal_id,
                &todo_id,
                !reject,
                comment.as_deref(),
            )?;
            let t = &change.todo;
            Ok(
                Output::new(json!({"todo": todo_json(t, now_ms()), "changed": change.changed}))
                    .heading(format!(
                        "Gate {} {}{}",
                        t.id,
                        if reject { "rejected" } else { "approved" },
                        if change.changed {
                            ""
                        } else {
                            " already: nothing changed"
                        }
                    ))
                    .fields([
                        ("status", t.status.to_string()),
                        ("changed", change.changed.to_string()),
                    ]),
            )
        }
    }
}
