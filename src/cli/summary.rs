//! `loopx summary_all --goal-id G`: evidence, rewards, runs and quota of one goal.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::clock::rfc3339;
use crate::error::Result;
use crate::kernel::projection::{evidence_json, goal_json, run_json};

#[derive(Debug, clap::Args)]
pub struct SummaryArgs {
    #[arg(long)]
    pub goal_id: String,
}

pub fn run(ctx: &Context, args: SummaryArgs) -> Result<Output> {
    let s = ctx.kernel()?.summary(&args.goal_id)?;
    let evidence_rows = s
        .recent_evidence
        .iter()
        .map(|e| vec![rfc3339(e.created_at), e.todo_id.clone(), e.text.clone()])
        .collect();
    let reward_rows = s
        .recent_rewards
        .iter()
        .map(|r| {
            vec![
                r.run_id.clone(),
                format!("{:+}", r.score),
                r.comment.clone(),
            ]
        })
        .collect();
    Ok(Output::new(json!({
        "goal": goal_json(&s.goal),
        "todo_counts": s.todo_counts,
        "run_count": s.run_count,
        "latest_run": s.latest_run.as_ref().map(run_json),
        "recent_evidence": s.recent_evidence.iter().map(evidence_json).collect::<Vec<_>>(),
        "recent_rewards": s.recent_rewards,
        "quota": s.quota.to_json(),
    }))
    .heading(format!("Summary of {}", s.goal.id))
    .fields([
        ("title", s.goal.title.clone()),
        ("status", s.goal.status.to_string()),
        ("todos", s.todo_counts.to_string()),
        ("runs", s.run_count.to_string()),
        (
            "quota",
            format!(
                "{} ({} / {})",
                s.quota.state, s.quota.spent_slots, s.quota.allowed_slots
            ),
        ),
    ])
    .heading("Recent evidence")
    .table(&["when", "todo", "text"], evidence_rows)
    .heading("Recent rewards")
    .table(&["run", "score", "comment"], reward_rows))
}
