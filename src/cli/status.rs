//! `loopx status`: the attention queue first, then one line per goal.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::clock::now_ms;
use crate::error::Result;
use crate::kernel::Kernel;
use crate::kernel::projection::{goal_json, todo_json};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// One goal (default: every goal that is not closed).
    #[arg(long)]
    pub goal_id: Option<String>,
    /// Print it again after every commit by any process (in place on a terminal) until
    /// Ctrl-C/SIGTERM or until stdout closes.
    #[arg(long)]
    pub watch: bool,
}

pub fn run(ctx: &Context, args: StatusArgs) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    if args.watch {
        return super::watch::run(ctx, &mut kernel, |k| snapshot(k, args.goal_id.as_deref()));
    }
    snapshot(&kernel, args.goal_id.as_deref())
}

fn snapshot(kernel: &Kernel, goal_id: Option<&str>) -> Result<Output> {
    let report = kernel.status(goal_id)?;
    let now = now_ms();
    let queue_rows = report
        .attention
        .iter()
        .map(|i| {
            vec![
                i.who.to_string(),
                i.kind.to_string(),
                i.goal_id.clone(),
                i.todo_id.clone().unwrap_or("-".into()),
                i.title.clone(),
                i.reason.clone(),
            ]
        })
        .collect();
    let goal_rows = report
        .goals
        .iter()
        .map(|g| {
            vec![
                g.goal.id.clone(),
                g.goal.status.to_string(),
                g.ready_count.to_string(),
                g.first_user_todo
                    .as_ref()
                    .map(|t| t.title.clone())
                    .unwrap_or("-".into()),
                g.top_agent_todo
                    .as_ref()
                    .map(|t| format!("{} {}", t.id, t.title))
                    .unwrap_or("-".into()),
                format!(
                    "{}/{} {}",
                    g.quota.spent_slots, g.quota.allowed_slots, g.quota.state
                ),
            ]
        })
        .collect();
    let goals_json: Vec<_> = report
        .goals
        .iter()
        .map(|g| {
            json!({
                "goal": goal_json(&g.goal),
                "ready_count": g.ready_count,
                "first_user_todo": g.first_user_todo.as_ref().map(|t| todo_json(t, now)),
                "top_agent_todo": g.top_agent_todo.as_ref().map(|t| todo_json(t, now)),
                "quota": g.quota.to_json(),
                "latest_run_id": g.latest_run_id,
            })
        })
        .collect();
    Ok(
        Output::new(json!({"attention": report.attention, "goals": goals_json}))
            .heading("Attention queue")
            .table(&["who", "kind", "goal", "todo", "title", "why"], queue_rows)
            .heading("Goals")
            .table(
                &[
                    "goal",
                    "status",
                    "ready",
                    "first user todo",
                    "top agent todo",
                    "quota",
                ],
                goal_rows,
            ),
    )
}
