//! `loopx start-goal --goal-text T [--project DIR]`: one step from nothing to a goal.

use serde_json::json;

use super::Context;
use super::goal::goal_output;
use super::output::Output;
use crate::error::Result;
use crate::kernel::Kernel;
use crate::kernel::goal::NewGoal;
use crate::paths::ProjectPaths;

#[derive(Debug, clap::Args)]
pub struct StartGoalArgs {
    /// What the goal should achieve, in prose.
    #[arg(long)]
    pub goal_text: String,
    /// Project directory (initialized if it has no `.loopx/`; default: the working directory).
    #[arg(long)]
    pub project: Option<std::path::PathBuf>,
}

pub fn run(ctx: &Context, args: StartGoalArgs) -> Result<Output> {
    let text = args.goal_text.trim().to_string();
    if text.is_empty() {
        return Err(crate::error::bad_input(
            "--goal-text is empty; say what the goal should achieve",
        ));
    }
    let project = match args.project.or_else(|| ctx.root.clone()) {
        Some(p) if p.is_absolute() => p,
        Some(p) => ctx.cwd.join(p),
        None => ctx.cwd.clone(),
    };
    // `start-goal` initializes a directory that has no project; a `.loopx/` whose database is
    // gone is a lost project, which only an explicit `loopx init` may replace.
    let paths = ProjectPaths::at(&project);
    if !paths.db().is_file() {
        paths.refuse_lost_database()?;
    }
    let initialized = Kernel::init(&project)?.is_some();
    let mut kernel = Kernel::open(ProjectPaths::at(&project))?;
    let title: String = text
        .lines()
        .next()
        .unwrap_or(&text)
        .chars()
        .take(120)
        .collect();
    let goal = kernel.create_goal(
        &ctx.operator_or_agent(),
        NewGoal {
            title,
            objective: Some(text),
            project_dir: Some(project.display().to_string()),
            ..Default::default()
        },
    )?;
    let g = &goal.id;
    let next = vec![
        format!("loopx todo add --goal-id {g} --title \"[P1] first bounded step\""),
        format!("loopx --format json quota should-run --goal-id {g}"),
        format!("loopx status --goal-id {g}"),
    ];
    let mut out = goal_output(&goal, "Started goal");
    out.value["initialized_project"] = json!(initialized);
    out.value["next_cli_actions"] = json!(next);
    Ok(out.heading("Next").list(next))
}
