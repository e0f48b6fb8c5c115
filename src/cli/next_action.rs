//! The kernel's next actions rendered as `loopx` commands.
//!
//! The kernel decides what an agent or operator should do next and returns it as data
//! ([`NextAction`]); this file is the one place that turns those values into command lines. The
//! text is part of the published interface (the `quota should-run` packet in docs/cli.md, the
//! README's walk-through, agent hosts that run `next_cli_argv` as given), so it must not drift:
//! the tests below parse every rendered command with the real parser, and
//! tests/it/output_snapshots.rs pins the packet.

use serde_json::{Value, json};

use crate::error::{Message, NextAction, Param, Part};
use crate::kernel::decision::Decision;

/// What the agent writes as evidence when it completes a todo; the host replaces it.
const EVIDENCE_PLACEHOLDER: &str = "<what changed and how it was checked>";
/// What a monitor's check observed; the host replaces it.
const OBSERVATION_PLACEHOLDER: &str = "<what the check observed>";
/// The title of the todo an agent adds when it replans; the host replaces it.
const TITLE_PLACEHOLDER: &str = "<the next bounded step toward the objective>";
/// The operator's decision on a gate.
const DECISION_PLACEHOLDER: &str = "<decision>";
/// The directory of an extension's new version (a usage-style word, which a shell passes as is).
const DIR_PLACEHOLDER: &str = "DIR";
/// The file a backup is written to.
const FILE_PLACEHOLDER: &str = "FILE";

/// The command that carries out `action`, as an argv vector (`loopx` first).
pub fn argv(action: &NextAction) -> Vec<String> {
    // The one argument not already text; declared here so the words below can borrow it.
    let share: String;
    let words: Vec<&str> = match action {
        NextAction::ClaimTodo {
            goal_id,
            todo_id,
            agent_id,
            idempotency_key,
        } => vec![
            "todo",
            "claim",
            "--goal-id",
            goal_id,
            "--todo-id",
            todo_id,
            "--agent-id",
            agent_id,
            "--idempotency-key",
            idempotency_key,
        ],
        // The lease holder's two ways to finish its turn's work: the same proof, the verb and
        // what the agent writes differ.
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
        } => {
            let (verb, text_flag, placeholder) = match action {
                NextAction::CheckMonitor { .. } => {
                    ("check", "--observation", OBSERVATION_PLACEHOLDER)
                }
                _ => ("complete", "--evidence", EVIDENCE_PLACEHOLDER),
            };
            vec![
                "todo",
                verb,
                "--goal-id",
                goal_id,
                "--todo-id",
                todo_id,
                "--agent-id",
                agent_id,
                "--claim-key",
                claim_key,
                text_flag,
                placeholder,
            ]
        }
        NextAction::RefreshState {
            goal_id,
            agent_id,
            todo_id,
        } => vec![
            "refresh-state",
            "--goal-id",
            goal_id,
            "--agent-id",
            agent_id,
            "--todo-id",
            todo_id,
        ],
        NextAction::SpendSlot { goal_id, agent_id } => vec![
            "quota",
            "spend-slot",
            "--goal-id",
            goal_id,
            "--agent-id",
            agent_id,
        ],
        NextAction::AddTodo { goal_id, agent_id } => vec![
            "todo",
            "add",
            "--goal-id",
            goal_id,
            "--agent-id",
            agent_id,
            "--title",
            TITLE_PLACEHOLDER,
        ],
        NextAction::ResolveGate { goal_id, todo_id } => vec![
            "gate",
            "resolve",
            "--goal-id",
            goal_id,
            "--todo-id",
            todo_id,
            "--comment",
            DECISION_PLACEHOLDER,
        ],
        NextAction::ListExtensions => vec!["extension", "list"],
        NextAction::ListTodos { goal_id } => vec!["todo", "list", "--goal-id", goal_id],
        NextAction::SetCompute { goal_id, compute } => {
            share = compute.to_string();
            vec!["quota", "set", "--goal-id", goal_id, "--compute", &share]
        }
        NextAction::ResumeGoal { goal_id } => vec!["goal", "resume", "--goal-id", goal_id],
        NextAction::RecordRun { goal_id } => vec!["refresh-state", "--goal-id", goal_id],
        NextAction::Reproject => vec!["refresh-state"],
        NextAction::ListGates { goal_id } => vec!["gate", "list", "--goal-id", goal_id],
        NextAction::UpgradeExtension => vec!["extension", "upgrade", DIR_PLACEHOLDER],
        NextAction::ListGoals => vec!["goal", "list"],
        NextAction::ShowHistory { goal_id } => vec!["history", "--goal-id", goal_id],
        NextAction::InitProject => vec!["init"],
        NextAction::CheckProject => vec!["doctor"],
        NextAction::BackUp => vec!["backup", FILE_PLACEHOLDER],
    };
    std::iter::once("loopx")
        .chain(words)
        .map(str::to_string)
        .collect()
}

/// The command that carries out `action`, as one line a shell runs as given.
pub fn command_line(action: &NextAction) -> String {
    match action {
        // The operator's line has always spelled the placeholder in double quotes (README, the
        // packet's `operator_cli_actions`); ids are path-safe tokens, so only the placeholder
        // differs from the argv joined below.
        NextAction::ResolveGate { goal_id, todo_id } => format!(
            "loopx gate resolve --goal-id {goal_id} --todo-id {todo_id} --comment \"{DECISION_PLACEHOLDER}\""
        ),
        _ => shell_join(&argv(action)),
    }
}

/// A kernel message as the CLI says it: named fields as their flags, actions as the command
/// lines that carry them out, in backquotes.
pub fn message_text(message: &Message) -> String {
    let mut text = String::new();
    for part in message.parts() {
        match part {
            Part::Text(t) => text.push_str(t),
            Part::Param(param) => text.push_str(&flag(*param)),
            Part::Action(action) => {
                text.push('`');
                text.push_str(&command_line(action));
                text.push('`');
            }
        }
    }
    text
}

/// The flag that sets a request field.
pub fn flag(param: Param) -> String {
    format!("--{}", param.name().replace('_', "-"))
}

/// The `quota should-run` packet: the kernel's decision with the next actions rendered as
/// commands (`interaction_contract.cli_channel.next_cli_actions` and `next_cli_argv`,
/// `user_channel.operator_cli_actions`).
pub fn should_run_packet(d: &Decision) -> Value {
    let argv: Vec<Vec<String>> = d.next_actions().iter().map(argv).collect();
    let lines: Vec<String> = argv.iter().map(|a| shell_join(a)).collect();
    let operator: Vec<String> = d.operator_actions().iter().map(command_line).collect();
    let mut packet = d.to_packet();
    let contract = &mut packet["interaction_contract"];
    contract["cli_channel"]["next_cli_actions"] = json!(lines);
    contract["cli_channel"]["next_cli_argv"] = json!(argv);
    contract["user_channel"]["operator_cli_actions"] = json!(operator);
    packet
}

/// Joins argv into one shell-safe line (single quotes where needed).
pub fn shell_join(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            if !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@".contains(&b))
            {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command, Nested};

    #[test]
    fn shell_quoting() {
        let argv = vec![
            "loopx".to_string(),
            "--evidence".to_string(),
            "it's done".to_string(),
        ];
        assert_eq!(shell_join(&argv), r"loopx --evidence 'it'\''s done'");
    }

    /// One value of every variant, with data that needs quoting where a real one may (a claim
    /// key is free text).
    fn every_action() -> Vec<NextAction> {
        let (g, t, a) = (
            "goal-1".to_string(),
            "t7".to_string(),
            "agent.x".to_string(),
        );
        vec![
            NextAction::ClaimTodo {
                goal_id: g.clone(),
                todo_id: t.clone(),
                agent_id: a.clone(),
                idempotency_key: "agent.x.t7.f1".into(),
            },
            NextAction::CompleteTodo {
                goal_id: g.clone(),
                todo_id: t.clone(),
                agent_id: a.clone(),
                claim_key: "a key with 'quotes'".into(),
            },
            NextAction::CheckMonitor {
                goal_id: g.clone(),
                todo_id: t.clone(),
                agent_id: a.clone(),
                claim_key: "a key with 'quotes'".into(),
            },
            NextAction::RefreshState {
                goal_id: g.clone(),
                agent_id: a.clone(),
                todo_id: t.clone(),
            },
            NextAction::SpendSlot {
                goal_id: g.clone(),
                agent_id: a.clone(),
            },
            NextAction::AddTodo {
                goal_id: g.clone(),
                agent_id: a.clone(),
            },
            NextAction::ResolveGate {
                goal_id: g.clone(),
                todo_id: t.clone(),
            },
            NextAction::ListExtensions,
            NextAction::ListTodos { goal_id: g.clone() },
            NextAction::SetCompute {
                goal_id: g.clone(),
                compute: 1.0,
            },
            NextAction::ResumeGoal { goal_id: g.clone() },
            NextAction::RecordRun { goal_id: g.clone() },
            NextAction::Reproject,
            NextAction::ListGates { goal_id: g.clone() },
            NextAction::UpgradeExtension,
            NextAction::ListGoals,
            NextAction::ShowHistory { goal_id: g },
            NextAction::InitProject,
            NextAction::CheckProject,
            NextAction::BackUp,
        ]
    }

    /// Splits a rendered line the way a POSIX shell does for the quoting `shell_join` and
    /// `command_line` produce (bare words, single quotes with `'\''`, double quotes).
    fn shell_split(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word: Option<String> = None;
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                ' ' => words.extend(word.take()),
                '\'' => {
                    let w = word.get_or_insert_with(String::new);
                    for c in chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                        w.push(c);
                    }
                }
                '"' => {
                    let w = word.get_or_insert_with(String::new);
                    for c in chars.by_ref() {
                        if c == '"' {
                            break;
                        }
                        w.push(c);
                    }
                }
                '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
                c => word.get_or_insert_with(String::new).push(c),
            }
        }
        words.extend(word);
        words
    }

    /// Every variant renders to a command the real parser accepts, as the command the action
    /// names, with the action's data in the right flags; the line says the same as the argv.
    #[test]
    fn every_rendered_action_parses_as_its_command() {
        use super::super::extension::ExtensionCommand;
        use super::super::gate::GateCommand;
        use super::super::goal::GoalCommand;
        use super::super::quota::QuotaCommand;
        use super::super::todo::TodoCommand;

        let mut covered = std::collections::BTreeSet::new();
        for action in every_action() {
            let argv = argv(&action);
            assert_eq!(
                shell_split(&command_line(&action)),
                argv,
                "{action:?}: the line and the argv differ"
            );
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| {
                panic!("{action:?} renders {argv:?}, which does not parse: {e}")
            });
            let parsed = cli.command;
            // Exhaustive on purpose: a new variant does not compile until it is checked here.
            let variant = match &action {
                NextAction::ClaimTodo {
                    goal_id,
                    todo_id,
                    agent_id,
                    idempotency_key,
                } => {
                    let Command::Todo(Nested {
                        command:
                            TodoCommand::Claim {
                                goal_id: g,
                                todo_id: t,
                                agent_id: a,
                                idempotency_key: k,
                                ..
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(
                        (g, t, a, k),
                        (
                            Some(goal_id.clone()),
                            Some(todo_id.clone()),
                            Some(agent_id.clone()),
                            Some(idempotency_key.clone())
                        )
                    );
                    0
                }
                NextAction::CompleteTodo {
                    goal_id,
                    todo_id,
                    agent_id,
                    claim_key,
                } => {
                    let Command::Todo(Nested {
                        command:
                            TodoCommand::Complete {
                                goal_id: g,
                                todo_id: t,
                                evidence,
                                proof,
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(
                        (g, t, proof.agent_id, proof.claim_key),
                        (
                            Some(goal_id.clone()),
                            todo_id.clone(),
                            Some(agent_id.clone()),
                            Some(claim_key.clone())
                        )
                    );
                    assert_eq!(evidence.as_deref(), Some(EVIDENCE_PLACEHOLDER));
                    1
                }
                NextAction::CheckMonitor {
                    goal_id,
                    todo_id,
                    agent_id,
                    claim_key,
                } => {
                    let Command::Todo(Nested {
                        command:
                            TodoCommand::Check {
                                goal_id: g,
                                todo_id: t,
                                observation,
                                failed,
                                proof,
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(
                        (&g, &t, &proof.agent_id, &proof.claim_key),
                        (
                            goal_id,
                            todo_id,
                            &Some(agent_id.clone()),
                            &Some(claim_key.clone())
                        )
                    );
                    assert_eq!(
                        (observation.as_deref(), failed),
                        (Some(OBSERVATION_PLACEHOLDER), None)
                    );
                    19
                }
                NextAction::RefreshState {
                    goal_id,
                    agent_id,
                    todo_id,
                } => {
                    let Command::RefreshState(args) = parsed else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(
                        (args.goal_id, args.agent_id, args.todo_id),
                        (
                            Some(goal_id.clone()),
                            Some(agent_id.clone()),
                            Some(todo_id.clone())
                        )
                    );
                    2
                }
                NextAction::SpendSlot { goal_id, agent_id } => {
                    let Command::Quota(Nested {
                        command:
                            QuotaCommand::SpendSlot {
                                goal_id: g,
                                agent_id: a,
                                slots,
                                effect_id,
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!((g, a), (Some(goal_id.clone()), Some(agent_id.clone())));
                    // One slot, keyed by the run refresh-state just recorded.
                    assert_eq!((slots, effect_id), (1, None));
                    3
                }
                NextAction::AddTodo { goal_id, agent_id } => {
                    let Command::Todo(Nested {
                        command:
                            TodoCommand::Add {
                                goal_id: g,
                                agent_id: a,
                                title,
                                ..
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!((g, a), (goal_id.clone(), Some(agent_id.clone())));
                    assert_eq!(title, TITLE_PLACEHOLDER);
                    4
                }
                NextAction::ResolveGate { goal_id, todo_id } => {
                    let Command::Gate(Nested {
                        command:
                            GateCommand::Resolve {
                                goal_id: g,
                                todo_id: t,
                                comment,
                                ..
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!((g, t), (goal_id.clone(), todo_id.clone()));
                    assert_eq!(comment.as_deref(), Some(DECISION_PLACEHOLDER));
                    5
                }
                NextAction::ListExtensions => {
                    assert!(
                        matches!(parsed, Command::Extension(_)),
                        "{argv:?} parsed as {parsed:?}"
                    );
                    6
                }
                NextAction::ListTodos { goal_id } => {
                    let Command::Todo(Nested {
                        command:
                            TodoCommand::List {
                                goal_id: g,
                                status,
                                watch,
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!((&g, status, watch), (goal_id, None, false));
                    7
                }
                NextAction::SetCompute { goal_id, compute } => {
                    let Command::Quota(Nested {
                        command:
                            QuotaCommand::Set {
                                goal_id: g,
                                compute: c,
                                ..
                            },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!((&g, c), (goal_id, Some(*compute)));
                    8
                }
                NextAction::ResumeGoal { goal_id } => {
                    let Command::Goal(Nested {
                        command: GoalCommand::Resume { goal_id: g },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(&g, goal_id);
                    9
                }
                NextAction::RecordRun { goal_id } => {
                    let Command::RefreshState(args) = parsed else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(args.goal_id.as_ref(), Some(goal_id));
                    assert_eq!((args.agent_id, args.todo_id), (None, None));
                    10
                }
                NextAction::Reproject => {
                    let Command::RefreshState(args) = parsed else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(args.goal_id, None);
                    11
                }
                NextAction::ListGates { goal_id } => {
                    let Command::Gate(Nested {
                        command: GateCommand::List { goal_id: g },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(&g, goal_id);
                    12
                }
                NextAction::UpgradeExtension => {
                    let Command::Extension(Nested {
                        command: ExtensionCommand::Upgrade { dir, grants },
                    }) = parsed
                    else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(dir, std::path::Path::new(DIR_PLACEHOLDER));
                    assert!(grants.is_empty());
                    13
                }
                NextAction::ListGoals => {
                    assert!(
                        matches!(
                            parsed,
                            Command::Goal(Nested {
                                command: GoalCommand::List
                            })
                        ),
                        "{argv:?} parsed as {parsed:?}"
                    );
                    14
                }
                NextAction::ShowHistory { goal_id } => {
                    let Command::History(args) = parsed else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!((&args.goal_id, args.before), (goal_id, None));
                    15
                }
                NextAction::InitProject => {
                    let Command::Init(args) = parsed else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(args.dir, None);
                    16
                }
                NextAction::CheckProject => {
                    assert!(
                        matches!(parsed, Command::Doctor(_)),
                        "{argv:?} parsed as {parsed:?}"
                    );
                    17
                }
                NextAction::BackUp => {
                    let Command::Backup(args) = parsed else {
                        panic!("{argv:?} parsed as {parsed:?}")
                    };
                    assert_eq!(args.path, std::path::Path::new(FILE_PLACEHOLDER));
                    18
                }
            };
            covered.insert(variant);
        }
        assert_eq!(
            covered.len(),
            20,
            "every_action() holds one value of each variant"
        );
    }

    /// Every field a kernel message can name renders as a flag some command takes.
    #[test]
    fn every_named_field_is_a_real_flag() {
        use clap::CommandFactory;

        fn collect(cmd: &clap::Command, flags: &mut std::collections::BTreeSet<String>) {
            flags.extend(
                cmd.get_arguments()
                    .filter_map(|a| a.get_long().map(str::to_string)),
            );
            for sub in cmd.get_subcommands() {
                collect(sub, flags);
            }
        }
        let mut cli = Cli::command();
        cli.build();
        let mut flags = std::collections::BTreeSet::new();
        collect(&cli, &mut flags);
        for param in Param::ALL {
            let flag = flag(*param);
            assert!(
                flags.contains(flag.trim_start_matches("--")),
                "{param:?} renders as {flag}, which no command takes"
            );
        }
    }

    /// A message renders its fields as flags and its actions as commands; `Display` (what a
    /// library caller reads) names neither a flag nor a `loopx` command.
    #[test]
    fn a_message_speaks_cli_only_through_the_cli() {
        let message = crate::error::msg![
            "pass ",
            Param::TtlSeconds,
            "; ",
            NextAction::ListTodos {
                goal_id: "g".into()
            },
            " shows them"
        ];
        assert_eq!(
            message_text(&message),
            "pass --ttl-seconds; `loopx todo list --goal-id g` shows them"
        );
        assert_eq!(
            message.to_string(),
            "pass ttl_seconds; `todo.list(goal_id=g)` shows them"
        );
    }

    /// The lines as the packet prints them today (README, docs/cli.md).
    #[test]
    fn the_lines_keep_their_published_spelling() {
        let lines: Vec<String> = every_action().iter().map(command_line).collect();
        assert_eq!(
            lines,
            [
                "loopx todo claim --goal-id goal-1 --todo-id t7 --agent-id agent.x --idempotency-key agent.x.t7.f1",
                r"loopx todo complete --goal-id goal-1 --todo-id t7 --agent-id agent.x --claim-key 'a key with '\''quotes'\''' --evidence '<what changed and how it was checked>'",
                r"loopx todo check --goal-id goal-1 --todo-id t7 --agent-id agent.x --claim-key 'a key with '\''quotes'\''' --observation '<what the check observed>'",
                "loopx refresh-state --goal-id goal-1 --agent-id agent.x --todo-id t7",
                "loopx quota spend-slot --goal-id goal-1 --agent-id agent.x",
                "loopx todo add --goal-id goal-1 --agent-id agent.x --title '<the next bounded step toward the objective>'",
                "loopx gate resolve --goal-id goal-1 --todo-id t7 --comment \"<decision>\"",
                "loopx extension list",
                "loopx todo list --goal-id goal-1",
                "loopx quota set --goal-id goal-1 --compute 1",
                "loopx goal resume --goal-id goal-1",
                "loopx refresh-state --goal-id goal-1",
                "loopx refresh-state",
                "loopx gate list --goal-id goal-1",
                "loopx extension upgrade DIR",
                "loopx goal list",
                "loopx history --goal-id goal-1",
                "loopx init",
                "loopx doctor",
                "loopx backup FILE",
            ]
        );
    }
}
