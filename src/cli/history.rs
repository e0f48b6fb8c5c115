//! `loopx history`: runs newest first, with reward overlays.

use serde_json::json;

use super::output::Output;
use super::{Context, opt};
use crate::clock::rfc3339;
use crate::error::Result;
use crate::kernel::projection::run_json;

#[derive(Debug, clap::Args)]
pub struct HistoryArgs {
    /// The goal (its id, as `goal list` shows it).
    #[arg(long)]
    pub goal_id: String,
    /// Most runs to show, newest first (1..=1000).
    #[arg(long, default_value_t = 20, allow_hyphen_values = true, value_parser = super::flags::limit)]
    pub limit: usize,
    /// Page back: only runs older than this run id.
    #[arg(long)]
    pub before: Option<String>,
}

pub fn run(ctx: &Context, args: HistoryArgs) -> Result<Output> {
    let entries = ctx
        .kernel()?
        .history(&args.goal_id, args.limit, args.before.as_deref())?;
    let rows = entries
        .iter()
        .map(|e| {
            let reward = if e.rewards.is_empty() {
                "-".to_string()
            } else {
                e.rewards
                    .iter()
                    .map(|r| format!("{:+}", r.score))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            vec![
                e.run.id.clone(),
                rfc3339(e.run.created_at),
                e.run.classification.clone(),
                opt(&e.run.agent_id),
                opt(&e.run.todo_id),
                reward,
                e.run.summary.clone(),
            ]
        })
        .collect();
    let json_entries: Vec<_> = entries
        .iter()
        .map(|e| {
            let mut v = run_json(&e.run);
            v["rewards"] = json!(e.rewards);
            v
        })
        .collect();
    // A short page is the last one: no cursor, so no link to an empty page.
    let next_before = if entries.len() == args.limit {
        entries.last().map(|e| e.run.id.clone())
    } else {
        None
    };
    Ok(Output::new(
        json!({"goal_id": args.goal_id, "runs": json_entries, "next_before": next_before}),
    )
    .heading(format!(
        "History of {} ({} run(s))",
        args.goal_id,
        entries.len()
    ))
    .table(
        &["run", "when", "class", "agent", "todo", "reward", "summary"],
        rows,
    ))
}
