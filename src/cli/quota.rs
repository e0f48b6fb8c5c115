//! `loopx quota should-run|spend-slot|void-slot|set|show`.

use clap::Subcommand;
use serde_json::json;

use super::output::Output;
use super::{Context, next_action, opt};
use crate::clock::rfc3339;
use crate::error::Result;
use crate::kernel::quota::{PolicyPatch, QuotaView, SpendReceipt, SpendRequest};

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum QuotaCommand {
    /// Decide whether this agent may run a turn now, and what exactly to run. Writes nothing.
    #[command(name = "should-run")]
    ShouldRun {
        /// The goal (default: the project's only active goal).
        #[arg(long)]
        goal_id: Option<String>,
        /// The agent asking (default: LOOPX_AGENT_ID, then "agent").
        #[arg(long)]
        agent_id: Option<String>,
    },
    /// Record compute spent, once per effect id (default: the latest run of the goal/agent).
    #[command(name = "spend-slot")]
    SpendSlot {
        /// The goal (default: the project's only active goal).
        #[arg(long)]
        goal_id: Option<String>,
        /// The agent that spent the compute (default: LOOPX_AGENT_ID, then "agent").
        #[arg(long)]
        agent_id: Option<String>,
        /// Slots to record (1..=10000).
        #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = super::flags::slots)]
        slots: i64,
        /// Names the spend so a retry counts once (default: the latest run of the goal and agent).
        #[arg(long)]
        effect_id: Option<String>,
    },
    /// Cancel an earlier spend (operators only).
    #[command(name = "void-slot")]
    VoidSlot {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The effect id of the spend to cancel.
        #[arg(long)]
        effect_id: String,
    },
    /// Set the goal's quota policy (operators only).
    Set {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// Share of the window automatic turns may use; 0 pauses them.
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::compute)]
        compute: Option<f64>,
        /// Length of the rolling window in hours.
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::window_hours)]
        window_hours: Option<f64>,
        /// Minutes of compute one slot stands for.
        #[arg(long, allow_hyphen_values = true, value_parser = super::flags::slot_minutes)]
        slot_minutes: Option<f64>,
        /// Explicit slots per window (overrides compute/window/slot).
        #[arg(long, conflicts_with = "clear_allowed_slots", allow_hyphen_values = true, value_parser = super::flags::slot_count)]
        allowed_slots: Option<i64>,
        /// Remove the explicit --allowed-slots (slots follow compute/window/slot again).
        #[arg(long)]
        clear_allowed_slots: bool,
        /// Most slots one agent may spend per window.
        #[arg(long, conflicts_with = "clear_per_agent_cap", allow_hyphen_values = true, value_parser = super::flags::slot_count)]
        per_agent_cap: Option<i64>,
        /// Remove the per-agent cap.
        #[arg(long)]
        clear_per_agent_cap: bool,
    },
    /// Policy, spent slots and recent ledger rows.
    Show {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// Also show this agent's spend against the per-agent cap.
        #[arg(long)]
        agent_id: Option<String>,
    },
}

fn quota_fields(q: &QuotaView) -> Vec<(&'static str, String)> {
    vec![
        ("state", q.state.to_string()),
        (
            "spent / allowed",
            format!("{} / {}", q.spent_slots, q.allowed_slots),
        ),
        ("remaining", q.remaining_slots.to_string()),
        ("compute", q.policy.compute.to_string()),
        ("window hours", q.policy.window_hours.to_string()),
        ("slot minutes", q.policy.slot_minutes.to_string()),
        ("per-agent cap", opt(&q.per_agent_cap)),
    ]
}

/// The window's spend series as one line of block characters, oldest span first: a dot for a
/// span with no net spend, then eight heights up to the busiest span.
fn sparkline(net_slots: &[i64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let top = net_slots.iter().copied().max().unwrap_or(0).max(1);
    net_slots
        .iter()
        .map(|&n| {
            if n <= 0 {
                '·'
            } else {
                BARS[((n * 8 - 1) / top).clamp(0, 7) as usize]
            }
        })
        .collect()
}

fn receipt_output(heading: &str, r: &SpendReceipt) -> Output {
    Output::new(json!({
        "effect_id": r.entry.effect_id,
        "run_id": r.entry.run_id,
        "slots": r.entry.slots,
        "idempotent_replay": r.idempotent_replay,
        "appended": !r.idempotent_replay,
        "before": r.before.to_json(),
        "after": r.after.to_json(),
    }))
    .heading(heading)
    .fields([
        ("effect id", r.entry.effect_id.clone()),
        ("slots", r.entry.slots.to_string()),
        ("replay", r.idempotent_replay.to_string()),
        ("spent before", r.before.spent_slots.to_string()),
        ("spent after", r.after.spent_slots.to_string()),
    ])
}

pub fn run(ctx: &Context, cmd: QuotaCommand) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    match cmd {
        QuotaCommand::ShouldRun { goal_id, agent_id } => {
            let goal_id = ctx.goal_id(&kernel, goal_id)?;
            let d = kernel.should_run(&goal_id, &ctx.agent_id(agent_id.as_deref()))?;
            let commands: Vec<String> = d
                .next_actions()
                .iter()
                .map(next_action::command_line)
                .collect();
            let ops: Vec<String> = d
                .operator_actions()
                .iter()
                .map(next_action::command_line)
                .collect();
            let mut out = Output::new(next_action::should_run_packet(&d))
                .heading(format!(
                    "{}: {}",
                    if d.should_run() { "run" } else { "skip" },
                    d.route
                ))
                .fields([
                    ("reason", d.reason.clone()),
                    (
                        "todo",
                        d.selected_todo
                            .as_ref()
                            .map(|s| format!("{} {}", s.todo.id, s.todo.title))
                            .unwrap_or("-".into()),
                    ),
                    (
                        "quota",
                        format!(
                            "{} ({} / {})",
                            d.quota.state, d.quota.spent_slots, d.quota.allowed_slots
                        ),
                    ),
                    (
                        "next check",
                        format!(
                            "{} after {}s",
                            d.scheduler_action, d.next_check_after_seconds
                        ),
                    ),
                ]);
            if !commands.is_empty() {
                out = out.heading("Next commands").list(commands);
            }
            if !ops.is_empty() {
                out = out.heading("Operator").list(ops);
            }
            Ok(out)
        }
        QuotaCommand::SpendSlot {
            goal_id,
            agent_id,
            slots,
            effect_id,
        } => {
            let goal_id = ctx.goal_id(&kernel, goal_id)?;
            let agent_id = agent_id.or_else(|| ctx.env_agent_id.clone());
            let actor = ctx.actor(agent_id.as_deref(), None, None);
            let r = kernel.spend(
                &actor,
                &SpendRequest {
                    goal_id,
                    agent_id,
                    slots,
                    effect_id,
                },
            )?;
            Ok(receipt_output(
                if r.idempotent_replay {
                    "Already spent (idempotent replay)"
                } else {
                    "Spent"
                },
                &r,
            ))
        }
        QuotaCommand::VoidSlot { goal_id, effect_id } => {
            let r = kernel.void_spend(&ctx.operator_or_agent(), &goal_id, &effect_id)?;
            Ok(receipt_output(
                if r.idempotent_replay {
                    "Already voided"
                } else {
                    "Voided"
                },
                &r,
            ))
        }
        QuotaCommand::Set {
            goal_id,
            compute,
            window_hours,
            slot_minutes,
            allowed_slots,
            clear_allowed_slots,
            per_agent_cap,
            clear_per_agent_cap,
        } => {
            let patch = PolicyPatch {
                compute,
                window_hours,
                slot_minutes,
                allowed_slots,
                per_agent_cap,
                clear_allowed_slots,
                clear_per_agent_cap,
            };
            let q = kernel.set_quota(&ctx.operator_or_agent(), &goal_id, patch)?;
            Ok(
                Output::new(json!({"goal_id": goal_id, "quota": q.to_json()}))
                    .heading(format!("Quota of {goal_id}"))
                    .fields(quota_fields(&q)),
            )
        }
        QuotaCommand::Show { goal_id, agent_id } => {
            let crate::kernel::quota::QuotaReport {
                view: q,
                recent_ledger: ledger,
                spend_series: series,
            } = kernel.quota(&goal_id, agent_id.as_deref())?;
            let rows = ledger
                .iter()
                .map(|e| {
                    vec![
                        rfc3339(e.created_at),
                        e.kind.to_string(),
                        e.slots.to_string(),
                        opt(&e.agent_id),
                        e.effect_id.clone(),
                    ]
                })
                .collect();
            let mut fields = quota_fields(&q);
            fields.push(("spent per span", sparkline(&series.net_slots)));
            Ok(Output::new(json!({
                "goal_id": goal_id,
                "quota": q.to_json(),
                "recent_ledger": ledger,
                "spend_series": series.to_json(),
            }))
            .heading(format!("Quota of {goal_id}"))
            .fields(fields)
            .heading("Recent ledger")
            .table(&["when", "kind", "slots", "agent", "effect id"], rows))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sparkline;

    #[test]
    fn the_sparkline_has_one_mark_per_span_scaled_to_the_busiest() {
        assert_eq!(sparkline(&[0, 1, 4, 8, -2]), "·▁▄█·");
        assert_eq!(sparkline(&[0, 0]), "··");
        assert_eq!(sparkline(&[3]), "█");
        assert_eq!(sparkline(&[]), "");
    }
}
