//! `loopx turn plan|run|recover|inspect|list`: one bounded agent turn (docs/turn-protocol.md).

use clap::{Args, Subcommand};
use serde_json::json;

use super::output::Output;
use super::{Context, opt};
use crate::clock::rfc3339;
use crate::error::{Result, bad_input, conflict};
use crate::model::{JournalStatus, Phase};
use crate::turn::host::install_stop_handlers;
use crate::turn::isolation::IsolationMode;
use crate::turn::{
    DEFAULT_TIMEOUT_SECONDS, TurnOutcome, TurnRequest, inspect, list_turns, plan, recover,
    refresh_projection, run_turn,
};

// Flags shared by `turn run` and `loop`. A plain comment: clap would show a doc comment here as
// the description of both commands.
#[derive(Debug, Args)]
pub struct TurnArgs {
    /// The goal (its id, as `goal list` shows it).
    #[arg(long)]
    pub goal_id: String,
    /// The agent running the turn (default: LOOPX_AGENT_ID, then "agent").
    #[arg(long)]
    pub agent_id: Option<String>,
    /// Host wall-clock budget; on expiry its whole process group is killed.
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECONDS, allow_hyphen_values = true, value_parser = super::flags::timeout_seconds)]
    pub timeout_seconds: u64,
    /// Validator argv as a JSON array, e.g. '["cargo","test"]'. It gets the normalized result on
    /// stdin; exit 0 proves the result, anything else is `validation_failed`.
    #[arg(long, value_name = "ARGV_JSON")]
    pub validate_json: Option<String>,
    /// Without a validator, accept a host's `completed` claim (default: recorded as progress).
    #[arg(long)]
    pub trust_host_completion: bool,
    /// Capability for the host's observations (default: the todo's, else builtin:default).
    #[arg(long, value_parser = super::flags::capability)]
    pub capability: Option<String>,
    /// Keep the host and validator out of `.loopx/` with OS namespaces: `auto` (isolate where
    /// the OS can, else warn and record `isolation: none`), `required` (refuse to start a turn
    /// the OS cannot isolate) or `off`.
    #[arg(long, default_value = "auto", value_parser = super::flags::wire::<IsolationMode>())]
    pub isolation: IsolationMode,
    /// The host argv (no shell), after `--`.
    #[arg(last = true, required = true, value_name = "HOST_ARGV")]
    pub host: Vec<String>,
}

impl TurnArgs {
    pub fn request(&self, ctx: &Context) -> Result<TurnRequest> {
        let validate_argv = match &self.validate_json {
            None => None,
            Some(text) => Some(serde_json::from_str::<Vec<String>>(text).map_err(|e| {
                bad_input(format!(
                    "--validate-json must be a JSON array of strings, e.g. '[\"make\",\"check\"]': {e}"
                ))
            })?),
        };
        let mut req = TurnRequest::new(
            &self.goal_id,
            &ctx.agent_id(self.agent_id.as_deref()),
            self.host.clone(),
        );
        req.validate_argv = validate_argv;
        req.timeout_seconds = self.timeout_seconds;
        req.trust_host_completion = self.trust_host_completion;
        req.capability = self.capability.clone();
        req.isolation = self.isolation;
        Ok(req)
    }
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum TurnCommand {
    /// The route a turn would take now, with its reason and selected todo. Writes nothing.
    Plan {
        /// The goal (its id, as `goal list` shows it).
        #[arg(long)]
        goal_id: String,
        /// The agent the plan is for (default: LOOPX_AGENT_ID, then "agent").
        #[arg(long)]
        agent_id: Option<String>,
    },
    /// Run one turn: recover, decide, claim, run the host, validate, write back, spend, close out.
    Run {
        #[command(flatten)]
        turn: TurnArgs,
        /// A specific todo (default: the decision's selected todo).
        #[arg(long)]
        todo_id: Option<String>,
        /// Name the turn: a settled key replays its stored result without effects; an unsettled
        /// one is resumed; an unused one names the new turn.
        #[arg(long)]
        turn_key: Option<String>,
    },
    /// Settle every unsettled turn whose driver is gone (resume after its last committed phase).
    Recover {
        /// Only turns of this goal (default: every goal).
        #[arg(long)]
        goal_id: Option<String>,
    },
    /// Print a turn's journal.
    Inspect {
        /// The turn's key, as `turn list` or `turn run` printed it.
        #[arg(long)]
        turn_key: String,
    },
    /// The newest turns in the journal, newest first. Writes nothing.
    List {
        /// Only turns of this goal (default: every goal).
        #[arg(long)]
        goal_id: Option<String>,
        /// Only turns in this journal status.
        #[arg(long, value_parser = super::flags::wire::<JournalStatus>())]
        status: Option<JournalStatus>,
        /// Most turns to show, newest first (1..=1000).
        #[arg(long, default_value_t = 20, allow_hyphen_values = true, value_parser = super::flags::limit)]
        limit: usize,
    },
}

fn phase_list(phases: &[Phase], separator: &str) -> String {
    phases
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join(separator)
}

pub(crate) fn outcome_output(heading: &str, o: &TurnOutcome) -> Output {
    let value = serde_json::to_value(o).expect("outcomes serialize");
    let mut out = Output::new(json!({ "turn": value }))
        .heading(heading)
        .fields([
            ("turn", opt(&o.turn_key)),
            ("goal / agent", format!("{} / {}", o.goal_id, o.agent_id)),
            ("todo", opt(&o.todo_id)),
            ("route", o.route.to_string()),
            ("kind", opt(&o.kind)),
            ("status", opt(&o.status)),
            ("phases", phase_list(&o.phases, " → ")),
            ("detail", o.detail.clone()),
            ("run", opt(&o.run_id)),
            ("spent", o.spent.to_string()),
            ("lease", opt(&o.lease)),
            ("replayed", o.replayed.to_string()),
            ("elapsed", format!("{} ms", o.elapsed_ms)),
        ]);
    if !o.recovered_turns.is_empty() {
        out = out.para(format!(
            "settled first (recovered): {}",
            o.recovered_turns.join(", ")
        ));
    }
    if !o.warnings.is_empty() {
        out = out.list(o.warnings.clone());
    }
    out
}

pub fn run(ctx: &Context, cmd: TurnCommand) -> Result<Output> {
    let mut kernel = ctx.kernel()?;
    match cmd {
        TurnCommand::Plan { goal_id, agent_id } => {
            let d = plan(&mut kernel, &goal_id, &ctx.agent_id(agent_id.as_deref()))?;
            let packet = d.to_packet();
            let selected = d
                .selected_todo
                .as_ref()
                .map(|s| format!("{} [{}] {}", s.todo.id, s.todo.priority, s.todo.title));
            Ok(Output::new(json!({
                "plan": {
                    "goal_id": d.goal_id,
                    "agent_id": d.agent_id,
                    "route": d.route,
                    "reason": d.reason,
                    "selected_todo": packet["selected_todo"],
                    "quota": packet["quota"],
                    "scheduler_hint": packet["scheduler_hint"],
                    "decided_at": rfc3339(d.decided_at),
                }
            }))
            .heading(format!("Turn plan for {} on {}", d.agent_id, d.goal_id))
            .fields([
                ("route", d.route.to_string()),
                ("reason", d.reason.clone()),
                ("selected todo", opt(&selected)),
                (
                    "next check",
                    format!("{} in {} s", d.scheduler_action, d.next_check_after_seconds),
                ),
            ]))
        }
        TurnCommand::Run {
            turn,
            todo_id,
            turn_key,
        } => {
            let mut req = turn.request(ctx)?;
            req.todo_id = todo_id;
            req.turn_key = turn_key;
            install_stop_handlers();
            let mut o = run_turn(&mut kernel, &req)?;
            if let Some(working) = &o.working_turn {
                return Err(conflict(format!(
                    "{}: this turn did not start; wait for turn '{working}' to settle (`loopx turn inspect --turn-key {working}`)",
                    o.reason
                )));
            }
            if o.kind.is_some() && !o.replayed {
                o.warnings
                    .extend(refresh_projection(&mut kernel, &o.goal_id));
            }
            let heading = match (o.kind, o.replayed) {
                (Some(k), true) => format!("Turn replayed: {k}"),
                (Some(k), false) => format!("Turn settled: {k}"),
                (None, _) => format!("No turn: route {}", o.route),
            };
            Ok(outcome_output(&heading, &o))
        }
        TurnCommand::Recover { goal_id } => {
            let outcomes = recover(&mut kernel, goal_id.as_deref(), None)?;
            let mut goals: Vec<&str> = outcomes.iter().map(|o| o.goal_id.as_str()).collect();
            goals.sort();
            goals.dedup();
            let warnings: Vec<String> = goals
                .into_iter()
                .filter_map(|g| refresh_projection(&mut kernel, g))
                .collect();
            let rows = outcomes
                .iter()
                .map(|o| {
                    vec![
                        opt(&o.turn_key),
                        o.agent_id.clone(),
                        opt(&o.todo_id),
                        opt(&o.kind),
                        opt(&o.status),
                        phase_list(&o.phases, ","),
                    ]
                })
                .collect();
            Ok(Output::new(json!({
                "recovered": outcomes.iter().filter(|o| o.status != Some(crate::turn::JournalStatus::InProgress)).count(),
                "turns": outcomes,
            }))
            .heading(format!("{} unsettled turn(s) examined", outcomes.len()))
            .table(
                &["turn", "agent", "todo", "kind", "status", "phases"],
                rows,
            )
            .list(warnings))
        }
        TurnCommand::List {
            goal_id,
            status,
            limit,
        } => {
            let turns = list_turns(&mut kernel, goal_id.as_deref(), status, limit)?;
            let rows = turns
                .iter()
                .map(|t| {
                    vec![
                        t.turn_key.clone(),
                        t.status.to_string(),
                        format!("{} / {}", t.goal_id, t.agent_id),
                        opt(&t.todo_id),
                        t.data["kind"].as_str().unwrap_or("-").to_string(),
                        t.phases
                            .last()
                            .map_or_else(|| "-".into(), |p| p.to_string()),
                        rfc3339(t.updated_at),
                    ]
                })
                .collect();
            Ok(Output::new(json!({ "turns": turns }))
                .heading(format!("{} turn(s), newest first", turns.len()))
                .table(
                    &[
                        "turn",
                        "status",
                        "goal / agent",
                        "todo",
                        "kind",
                        "last phase",
                        "updated",
                    ],
                    rows,
                ))
        }
        TurnCommand::Inspect { turn_key } => {
            let rec = inspect(&mut kernel, &turn_key)?;
            let d = &rec.data;
            let fields = vec![
                (
                    "goal / agent",
                    format!("{} / {}", rec.goal_id, rec.agent_id),
                ),
                ("todo", opt(&rec.todo_id)),
                ("status", rec.status.to_string()),
                ("phases", phase_list(&rec.phases, " → ")),
                ("kind", d["kind"].as_str().unwrap_or("-").to_string()),
                ("failure", d["failure"].as_str().unwrap_or("-").to_string()),
                ("lease", d["lease"].as_str().unwrap_or("-").to_string()),
                ("run", d["run_id"].as_str().unwrap_or("-").to_string()),
                ("created", rfc3339(rec.created_at)),
                ("updated", rfc3339(rec.updated_at)),
            ];
            Ok(Output::new(json!({ "journal": rec }))
                .heading(format!("Turn {}", rec.turn_key))
                .fields(fields))
        }
    }
}
