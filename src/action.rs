//! What someone can do next, as data.
//!
//! The kernel knows *what* must happen to move things on (claim this todo, resolve that gate,
//! list the goals, check the database) but not *how* its caller speaks: the CLI renders an action
//! as the exact `loopx` command line (`cli::next_action`), an HTTP view as a link or a form. The
//! same closed set serves the `quota should-run` decision and the remedy an error names
//! ([`crate::error::Message`]), so no library caller is handed shell advice and every command the
//! CLI prints is checked against its real parser. This module imports nothing, so the error type
//! below every other module can carry it.

/// Something an agent or an operator can do next, with the data it needs.
///
/// A closed set: the kernel names the action and fills in the ids and keys; how it is carried out
/// is the front end's business. Text the actor must supply (evidence, a title, a decision, a
/// file name) is not part of the action.
#[derive(Debug, Clone, PartialEq)]
pub enum NextAction {
    /// Lease `todo_id` under a claim key chosen so that a retried claim replays the same lease.
    ClaimTodo {
        goal_id: String,
        todo_id: String,
        agent_id: String,
        idempotency_key: String,
    },
    /// Complete the leased todo with evidence of what changed and how it was checked.
    CompleteTodo {
        goal_id: String,
        todo_id: String,
        agent_id: String,
        claim_key: String,
    },
    /// Record the run and rewrite the goal's projections.
    RefreshState {
        goal_id: String,
        agent_id: String,
        todo_id: String,
    },
    /// Record a run of the goal (so that there is a run to spend a slot for).
    RecordRun { goal_id: String },
    /// Re-create every projection from the database.
    Reproject,
    /// Spend the turn's compute slot, once, after the work is written back.
    SpendSlot { goal_id: String, agent_id: String },
    /// Add the next bounded step toward the goal's objective (the agent replans).
    AddTodo { goal_id: String, agent_id: String },
    /// An operator resolves a gate with a decision.
    ResolveGate { goal_id: String, todo_id: String },
    /// Look at a goal's open gates.
    ListGates { goal_id: String },
    /// An operator looks at the installed extensions (to install or enable a missing one).
    ListExtensions,
    /// Replace an installed extension with a new version from its directory.
    UpgradeExtension,
    /// Look at a goal's todos (to see which exist, or which are bound to missing capabilities).
    ListTodos { goal_id: String },
    /// Look at the project's goals.
    ListGoals,
    /// Look at a goal's runs, newest first.
    ShowHistory { goal_id: String },
    /// An operator gives the goal compute again.
    SetCompute { goal_id: String, compute: f64 },
    /// An operator resumes a paused goal.
    ResumeGoal { goal_id: String },
    /// Create the project's state directory and database.
    InitProject,
    /// Check the database and projections and list what is damaged.
    CheckProject,
    /// Write a consistent copy of the database.
    BackUp,
}

impl NextAction {
    /// The action as an operation name with its data (`todo.list(goal_id=g)`): how messages read
    /// by a caller that is not the CLI name it. Front ends render their own form instead.
    pub fn describe(&self) -> String {
        let (op, args): (&str, Vec<(&str, String)>) = match self {
            NextAction::ClaimTodo {
                goal_id,
                todo_id,
                agent_id,
                idempotency_key,
            } => (
                "todo.claim",
                vec![
                    ("goal_id", goal_id.clone()),
                    ("todo_id", todo_id.clone()),
                    ("agent_id", agent_id.clone()),
                    ("idempotency_key", idempotency_key.clone()),
                ],
            ),
            NextAction::CompleteTodo {
                goal_id,
                todo_id,
                agent_id,
                claim_key,
            } => (
                "todo.complete",
                vec![
                    ("goal_id", goal_id.clone()),
                    ("todo_id", todo_id.clone()),
                    ("agent_id", agent_id.clone()),
                    ("claim_key", claim_key.clone()),
                ],
            ),
            NextAction::RefreshState {
                goal_id,
                agent_id,
                todo_id,
            } => (
                "refresh_state",
                vec![
                    ("goal_id", goal_id.clone()),
                    ("agent_id", agent_id.clone()),
                    ("todo_id", todo_id.clone()),
                ],
            ),
            NextAction::RecordRun { goal_id } => {
                ("refresh_state", vec![("goal_id", goal_id.clone())])
            }
            NextAction::Reproject => ("refresh_state", vec![]),
            NextAction::SpendSlot { goal_id, agent_id } => (
                "quota.spend_slot",
                vec![("goal_id", goal_id.clone()), ("agent_id", agent_id.clone())],
            ),
            NextAction::AddTodo { goal_id, agent_id } => (
                "todo.add",
                vec![("goal_id", goal_id.clone()), ("agent_id", agent_id.clone())],
            ),
            NextAction::ResolveGate { goal_id, todo_id } => (
                "gate.resolve",
                vec![("goal_id", goal_id.clone()), ("todo_id", todo_id.clone())],
            ),
            NextAction::ListGates { goal_id } => ("gate.list", vec![("goal_id", goal_id.clone())]),
            NextAction::ListExtensions => ("extension.list", vec![]),
            NextAction::UpgradeExtension => ("extension.upgrade", vec![]),
            NextAction::ListTodos { goal_id } => ("todo.list", vec![("goal_id", goal_id.clone())]),
            NextAction::ListGoals => ("goal.list", vec![]),
            NextAction::ShowHistory { goal_id } => ("history", vec![("goal_id", goal_id.clone())]),
            NextAction::SetCompute { goal_id, compute } => (
                "quota.set",
                vec![
                    ("goal_id", goal_id.clone()),
                    ("compute", compute.to_string()),
                ],
            ),
            NextAction::ResumeGoal { goal_id } => {
                ("goal.resume", vec![("goal_id", goal_id.clone())])
            }
            NextAction::InitProject => ("init", vec![]),
            NextAction::CheckProject => ("doctor", vec![]),
            NextAction::BackUp => ("backup", vec![]),
        };
        let args: Vec<String> = args.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{op}({})", args.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_reads_as_an_operation_with_its_data() {
        let action = NextAction::ListTodos {
            goal_id: "g".into(),
        };
        assert_eq!(action.describe(), "todo.list(goal_id=g)");
        assert_eq!(NextAction::ListGoals.describe(), "goal.list()");
    }
}
