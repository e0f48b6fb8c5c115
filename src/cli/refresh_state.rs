//! `loopx refresh-state`: record a run and rewrite the goal's projections; without `--goal-id`,
//! re-create every projection from the database.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::Result;
use crate::kernel::projection::run_json;
use crate::kernel::run::RefreshRequest;

#[derive(Debug, clap::Args)]
pub struct RefreshStateArgs {
    /// The goal to record a run for; omit to re-create all projections (no run is recorded).
    #[arg(long)]
    pub goal_id: Option<String>,
    /// The agent the run is recorded for (default: LOOPX_AGENT_ID; without either, the run is
    /// the operator's).
    #[arg(long)]
    pub agent_id: Option<String>,
    /// The todo this run worked on.
    #[arg(long)]
    pub todo_id: Option<String>,
    /// What kind of run this is (default: state_refresh).
    #[arg(long)]
    pub classification: Option<String>,
    /// e.g. outcome_progress, primary_goal_outcome.
    #[arg(long)]
    pub outcome: Option<String>,
    /// One-paragraph summary of the run, shown in history and the run report.
    #[arg(long)]
    pub summary: Option<String>,
}

pub fn run(ctx: &Context, args: RefreshStateArgs) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    let Some(goal_id) = args.goal_id else {
        let reports = kernel.reproject_all()?;
        return Ok(
            Output::new(json!({"reprojected": true, "run_reports_written": reports}))
                .heading("Re-created all projections from the database")
                .fields([("run reports written", reports.to_string())]),
        );
    };
    let agent_id = args.agent_id.or_else(|| ctx.env_agent_id.clone());
    let actor = ctx.actor(agent_id.as_deref(), None, None);
    let req = RefreshRequest {
        goal_id: goal_id.clone(),
        agent_id,
        todo_id: args.todo_id,
        classification: args.classification,
        outcome: args.outcome,
        summary: args.summary,
    };
    let run = kernel.refresh_state(&actor, &req)?;
    let paths = kernel.paths();
    let json_path = paths.run_json(&goal_id, &run.id);
    let md_path = paths.run_md(&goal_id, &run.id);
    let state = paths.goal_state_json(&goal_id);
    Ok(Output::new(json!({
        "run": run_json(&run),
        "run_id": run.id,
        "json_path": json_path,
        "markdown_path": md_path,
        "state_file": state,
    }))
    .heading(format!("Recorded run {}", run.id))
    .fields([
        ("summary", run.summary.clone()),
        ("report", json_path.display().to_string()),
        ("state", state.display().to_string()),
    ]))
}
