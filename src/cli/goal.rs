//! `loopx goal create|list|show|close|pause|resume`.

use clap::Subcommand;
use serde_json::{Value, json};

use super::output::Output;
use super::{Context, opt};
use crate::clock::rfc3339;
use crate::error::Result;
use crate::kernel::goal::NewGoal;
use crate::kernel::projection::{goal_json, todo_json};
use crate::model::{Goal, GoalStatus};

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum GoalCommand {
    /// Create a goal.
    Create {
        /// The goal's title, one line; the id is derived from it unless --id is given.
        #[arg(long)]
        title: String,
        /// What success looks like, in prose (default: the title).
        #[arg(long)]
        objective: Option<String>,
        /// Explicit goal id (default: derived from the title).
        #[arg(long)]
        id: Option<String>,
        /// A success criterion; repeat for several.
        #[arg(long = "success-criterion")]
        success_criteria: Vec<String>,
        /// The project directory agents work in.
        #[arg(long, value_parser = super::flags::path)]
        project: Option<std::path::PathBuf>,
    },
    /// List goals.
    List,
    /// Show one goal with its todos.
    Show {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
    /// Close a goal for good (operators only).
    Close {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
    /// Pause a goal: no new claims or turns (operators only).
    Pause {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
    /// Resume a paused goal (operators only).
    Resume {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
}

pub(crate) fn goal_output(goal: &Goal, heading: &str) -> Output {
    Output::new(json!({"goal": goal_json(goal)}))
        .heading(format!("{heading} {}", goal.id))
        .fields([
            ("title", goal.title.clone()),
            ("status", goal.status.to_string()),
            ("objective", goal.objective.clone()),
            ("project", opt(&goal.project_dir)),
            ("created", rfc3339(goal.created_at)),
        ])
}

pub(crate) fn goals_output(goals: &[Goal]) -> Output {
    let rows = goals
        .iter()
        .map(|g| {
            vec![
                g.id.clone(),
                g.status.to_string(),
                g.title.clone(),
                rfc3339(g.created_at),
            ]
        })
        .collect();
    Output::new(json!({"goals": goals.iter().map(goal_json).collect::<Vec<Value>>()}))
        .heading(format!("{} goal(s)", goals.len()))
        .table(&["id", "status", "title", "created"], rows)
}

pub(crate) fn create(ctx: &Context, new: NewGoal) -> Result<Goal> {
    ctx.kernel()?.create_goal(&ctx.operator_or_agent(), new)
}

pub fn run(ctx: &Context, cmd: GoalCommand) -> Result<Output> {
    let set = |goal_id: &str, status: GoalStatus, verb: &str| -> Result<Output> {
        let goal = ctx
            .kernel()?
            .set_goal_status(&ctx.operator_or_agent(), goal_id, status)?;
        Ok(goal_output(&goal, verb))
    };
    match cmd {
        GoalCommand::Create {
            title,
            objective,
            id,
            success_criteria,
            project,
        } => {
            let project_dir = project
                .map(|p| ctx.absolute(&p).map(|p| p.display().to_string()))
                .transpose()?;
            let goal = create(
                ctx,
                NewGoal {
                    id,
                    title,
                    objective,
                    success_criteria,
                    project_dir,
                },
            )?;
            Ok(goal_output(&goal, "Created goal"))
        }
        GoalCommand::List => Ok(goals_output(&ctx.kernel()?.goals()?)),
        GoalCommand::Show { goal_id } => {
            let kernel = ctx.kernel()?;
            let goal = kernel.goal(&goal_id)?;
            let todos = kernel.todos(&goal_id)?;
            let now = crate::clock::now_ms();
            let rows = todos
                .iter()
                .map(|t| {
                    vec![
                        t.id.clone(),
                        t.priority.to_string(),
                        t.kind.to_string(),
                        t.status.to_string(),
                        t.title.clone(),
                    ]
                })
                .collect();
            let mut out = goal_output(&goal, "Goal");
            out.value["todos"] = todos.iter().map(|t| todo_json(t, now)).collect();
            if let Some(p) = &goal.next_probe {
                out = out.fields([("next probe", p.clone())]);
            }
            if let Some(p) = kernel.goal_probe(&goal_id)? {
                out.value["provider_probe"] = crate::kernel::projection::goal_probe_json(&p);
                out = out.fields(super::probe::probe_fields(&p));
            }
            Ok(out
                .heading("Todos")
                .table(&["id", "pri", "kind", "status", "title"], rows))
        }
        GoalCommand::Close { goal_id } => set(&goal_id, GoalStatus::Closed, "Closed goal"),
        GoalCommand::Pause { goal_id } => set(&goal_id, GoalStatus::Paused, "Paused goal"),
        GoalCommand::Resume { goal_id } => set(&goal_id, GoalStatus::Active, "Resumed goal"),
    }
}
