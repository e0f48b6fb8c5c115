//! `loopx probe set|show`: the goal's next probe, stored as text and never executed.

use clap::Subcommand;
use serde_json::json;

use super::output::Output;
use super::{Context, opt};
use crate::error::Result;

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum ProbeCommand {
    /// Store the next probe (or clear it with --clear).
    Set {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The probe: a check to run next, stored as text and shown, never executed.
        #[arg(long, required_unless_present = "clear", value_parser = super::flags::probe_text)]
        text: Option<String>,
        /// Remove the stored probe.
        #[arg(long, conflicts_with = "text")]
        clear: bool,
    },
    /// Show the stored probe.
    Show {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
    },
}

pub fn run(ctx: &Context, cmd: ProbeCommand) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    let goal = match cmd {
        ProbeCommand::Set { goal_id, text, .. } => {
            kernel.set_probe(&ctx.operator_or_agent(), &goal_id, text)?
        }
        ProbeCommand::Show { goal_id } => kernel.goal(&goal_id)?,
    };
    Ok(
        Output::new(json!({"goal_id": goal.id, "next_probe": goal.next_probe, "executed": false}))
            .heading(format!("Next probe of {}", goal.id))
            .fields([
                ("probe", opt(&goal.next_probe)),
                (
                    "note",
                    "stored and shown; LoopX never executes it".to_string(),
                ),
            ]),
    )
}
