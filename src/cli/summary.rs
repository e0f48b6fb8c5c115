//! `loopx summary_all --goal-id G`: evidence, rewards, runs and quota of one goal.

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::clock::rfc3339;
use crate::error::Result;
use crate::kernel::projection::{evidence_json, goal_json, run_json};

#[derive(Debug, clap::Args)]
pub struct SummaryArgs {
    /// The goal (its id, as `goal list` shows it).
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
        ("todos", counts_text(&s.todo_counts)),
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

/// Todo counts by role and status as text ("agent: 3 open, 2 completed; user: 1 open"),
/// statuses with none left out; the JSON output keeps the full object.
fn counts_text(counts: &serde_json::Value) -> String {
    let roles: Vec<String> = counts
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(role, statuses)| {
            let parts: Vec<String> = statuses
                .as_object()?
                .iter()
                .filter_map(|(status, n)| {
                    let n = n.as_u64()?;
                    (n > 0).then(|| format!("{n} {status}"))
                })
                .collect();
            (!parts.is_empty()).then(|| format!("{role}: {}", parts.join(", ")))
        })
        .collect();
    if roles.is_empty() {
        "none".to_string()
    } else {
        roles.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_text() {
        let counts =
            json!({"agent": {"open": 3, "claimed": 0, "completed": 2}, "user": {"open": 1}});
        assert_eq!(
            counts_text(&counts),
            "agent: 2 completed, 3 open; user: 1 open"
        );
        assert_eq!(counts_text(&json!({"agent": {"open": 0}})), "none");
        assert_eq!(counts_text(&json!({})), "none");
    }
}
