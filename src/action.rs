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
    /// Check the leased monitor and record what was observed (a monitor is checked, never
    /// completed).
    CheckMonitor {
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
            }
            | NextAction::CheckMonitor {
                goal_id,
                todo_id,
                agent_id,
                claim_key,
            } => (
                if matches!(self, NextAction::CheckMonitor { .. }) {
                    "todo.check"
                } else {
                    "todo.complete"
                },
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

    /// The string literals of a Rust source file, up to its first `#[cfg(test)]` (tests may
    /// spell what they check). Enough of a lexer for this crate's code: comments, escapes, raw
    /// strings and char literals.
    fn string_literals(source: &str) -> Vec<(usize, String)> {
        let source = source.split("#[cfg(test)]").next().unwrap_or_default();
        let chars: Vec<char> = source.chars().collect();
        let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
        while i < chars.len() {
            match chars[i] {
                '\n' => line += 1,
                '/' if chars.get(i + 1) == Some(&'/') => {
                    while i < chars.len() && chars[i] != '\n' {
                        i += 1;
                    }
                    continue;
                }
                '\'' if chars.get(i + 2) == Some(&'\'') || chars.get(i + 1) == Some(&'\\') => {
                    // A char literal ('"', '\'', '\n'); a lifetime has no closing quote.
                    let end = (i + 1..chars.len().min(i + 12))
                        .find(|&j| chars[j] == '\'' && (j > i + 2 || chars[i + 1] != '\\'));
                    if let Some(end) = end {
                        i = end + 1;
                        continue;
                    }
                }
                'r' if matches!(chars.get(i + 1), Some('"') | Some('#'))
                    && !chars
                        .get(i.wrapping_sub(1))
                        .is_some_and(|c| c.is_alphanumeric() || *c == '_') =>
                {
                    let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
                    let start = i + 2 + hashes;
                    let closing: Vec<char> = std::iter::once('"')
                        .chain(std::iter::repeat_n('#', hashes))
                        .collect();
                    let mut j = start;
                    while j + closing.len() <= chars.len()
                        && chars[j..j + closing.len()] != closing[..]
                    {
                        j += 1;
                    }
                    let text: String = chars[start..j.min(chars.len())].iter().collect();
                    out.push((line, text.clone()));
                    line += text.matches('\n').count();
                    i = j + closing.len();
                    continue;
                }
                '"' => {
                    let (start_line, mut text, mut j) = (line, String::new(), i + 1);
                    while j < chars.len() && chars[j] != '"' {
                        if chars[j] == '\\' {
                            j += 1;
                        }
                        if chars.get(j) == Some(&'\n') {
                            line += 1;
                        }
                        text.extend(chars.get(j));
                        j += 1;
                    }
                    out.push((start_line, text));
                    i = j + 1;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        out
    }

    /// What a CLI-only text looks like: a `loopx` command or a `--flag`.
    fn speaks_cli(text: &str) -> bool {
        let words: Vec<&str> = text.split_whitespace().collect();
        // Commands are quoted in backticks wherever the code base spells one.
        let command = words.windows(2).any(|w| {
            w[0] == "`loopx" && w[1].chars().next().is_some_and(|c| c.is_ascii_lowercase())
        });
        let flag = text.match_indices("--").any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + 2..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
                && after.is_some_and(|c| c.is_ascii_lowercase())
        });
        command || flag
    }

    /// Below the CLI nothing spells a command line or a flag: a message names fields and
    /// actions as values ([`crate::error::Message`]), and the CLI renders them.
    #[test]
    fn nothing_below_the_cli_spells_a_command_or_a_flag() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![];
        let mut dirs = vec![root.join("kernel"), root.join("model")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        for name in [
            "error.rs",
            "action.rs",
            "paths.rs",
            "ids.rs",
            "clock.rs",
            "inert.rs",
        ] {
            files.push(root.join(name));
        }
        let mut found = vec![];
        for file in files {
            let source = std::fs::read_to_string(&file).unwrap();
            for (line, text) in string_literals(&source) {
                if speaks_cli(&text) {
                    found.push(format!("{}:{line}: {text:?}", file.display()));
                }
            }
        }
        assert!(
            found.is_empty(),
            "CLI text below the CLI:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn the_scan_finds_commands_and_flags_and_nothing_else() {
        let literals = string_literals(
            "let a = \"run `loopx init` first\"; // \"--not-this\"\nlet b = r#\"pass --ttl-seconds\"#;\n\
             let c = '\"'; let d = \"x -- y\"; let e = \"--\";",
        );
        let flagged: Vec<bool> = literals.iter().map(|(_, t)| speaks_cli(t)).collect();
        assert_eq!(flagged, [true, true, false, false], "{literals:?}");
    }

    #[test]
    fn an_action_reads_as_an_operation_with_its_data() {
        let action = NextAction::ListTodos {
            goal_id: "g".into(),
        };
        assert_eq!(action.describe(), "todo.list(goal_id=g)");
        assert_eq!(NextAction::ListGoals.describe(), "goal.list()");
    }
}
