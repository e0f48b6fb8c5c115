//! `loopx reward add`: a human reward overlay on a run.

use clap::Subcommand;
use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::Result;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum RewardCommand {
    /// Score a run (operators only).
    Add {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The run to score (a run id from `history`).
        #[arg(long)]
        run_id: String,
        /// The score, a finite number in -1000000..=1000000 (higher is better).
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::score)]
        score: f64,
        /// Why this score (free text).
        #[arg(long, default_value = "")]
        comment: String,
    },
}

pub fn run(ctx: &Context, cmd: RewardCommand) -> Result<Output> {
    let RewardCommand::Add {
        goal_id,
        run_id,
        score,
        comment,
    } = cmd;
    let reward =
        ctx.kernel()?
            .add_reward(&ctx.operator_or_agent(), &goal_id, &run_id, score, &comment)?;
    Ok(Output::new(json!({"reward": reward}))
        .heading(format!("Reward on run {run_id}"))
        .fields([("score", score.to_string()), ("comment", comment)]))
}
