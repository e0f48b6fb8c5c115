//! `loopx project_prompt create|list|close`: the seeds' spelling of `goal create|list|close`.

use clap::Subcommand;
use serde_json::Value;

use super::Context;
use super::goal::{create, goal_output, goals_output};
use super::output::Output;
use crate::error::Result;
use crate::kernel::goal::NewGoal;
use crate::kernel::projection::goal_json;
use crate::model::GoalStatus;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ProjectPromptCommand {
    /// Create a goal (alias of `goal create --title --objective`).
    Create {
        /// The goal's title.
        #[arg(long)]
        title: String,
        /// What success looks like (the goal's objective; default: the title).
        #[arg(long)]
        description: Option<String>,
    },
    /// List goals; `--json` prints a JSON array whose items carry `id`.
    List {
        /// Print a JSON array of goals (same as --format json, in the seed's shape).
        #[arg(long)]
        json: bool,
    },
    /// Close a goal (alias of `goal close`).
    Close {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
}

pub fn run(ctx: &Context, cmd: ProjectPromptCommand) -> Result<Output> {
    match cmd {
        ProjectPromptCommand::Create { title, description } => {
            let goal = create(
                ctx,
                NewGoal {
                    title,
                    objective: description,
                    ..Default::default()
                },
            )?;
            Ok(goal_output(&goal, "Created goal"))
        }
        ProjectPromptCommand::List { .. } => {
            let goals = ctx.kernel()?.goals()?;
            let mut out = goals_output(&goals);
            // The seeds pipe this into `jq '.[0].id'`: a bare array, newest goal first.
            out.value = Value::Array(goals.iter().rev().map(goal_json).collect());
            Ok(out)
        }
        ProjectPromptCommand::Close { goal_id } => {
            let goal = ctx.kernel()?.set_goal_status(
                &ctx.operator_or_agent(),
                &goal_id,
                GoalStatus::Closed,
            )?;
            Ok(goal_output(&goal, "Closed goal"))
        }
    }
}
