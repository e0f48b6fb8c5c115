//! Parsing the process arguments with a command tree that holds only the invoked command.
//!
//! Every command is a fresh process, so building clap's tree is part of every command's cost.
//! The subcommands' own arguments are built only when used (`defer` on [`Command`]), but clap
//! copies each global flag (`--root`, `--format`, `-q`, `-v`) into every top-level subcommand
//! before parsing: some 120 argument clones and the fresh heap pages they fill, for one of the
//! thirty subcommands. When the arguments name their top-level subcommand, the tree is built
//! with that one alone; clap then parses, reports errors and prints help exactly as with the
//! whole tree, since nothing outside the invoked subcommand takes part. Anything else (no
//! subcommand, `--help` or `--version` at the top, an unknown word or flag) is parsed with the
//! whole tree, which is what names the choices.

use std::ffi::OsString;

use clap::{CommandFactory, FromArgMatches};

use super::{BIN_NAME, Cli};

/// The process arguments as a [`Cli`], as `Cli::try_parse` gives them, except that the command
/// tree clap built to parse them is left for the exit to release, as the store is: freeing its
/// thousands of small allocations cost more than half of parsing (docs/benchmarks.md).
pub(super) fn parse_args() -> Result<Cli, clap::Error> {
    parse_from(std::env::args_os().collect(), std::mem::forget)
}

/// Parses `args` with the smallest tree that parses them as the whole tree does; `release`
/// receives each tree built once it is no longer needed (the matches are always forgotten).
fn parse_from(args: Vec<OsString>, release: fn(clap::Command)) -> Result<Cli, clap::Error> {
    let mut command = tree_for(&args, release);
    let repeated_format = format_given_twice(&args);
    let parsed = command
        .try_get_matches_from_mut(args)
        .and_then(|mut matches| {
            let cli = Cli::from_arg_matches_mut(&mut matches);
            std::mem::forget(matches);
            cli.map_err(|e| e.format(&mut Cli::command()))
        })
        .and_then(|cli| {
            // clap checks a global flag's conflicts and repeats within one level only; given
            // once before the command and once after it, they would pass unnoticed.
            use clap::error::ErrorKind::ArgumentConflict;
            if cli.quiet == Some(true) && cli.verbose == Some(true) {
                return Err(command.error(
                    ArgumentConflict,
                    "the argument '--quiet' cannot be used with '--verbose'",
                ));
            }
            if repeated_format {
                return Err(command.error(
                    ArgumentConflict,
                    "the argument '--format <FORMAT>' cannot be used multiple times",
                ));
            }
            Ok(cli)
        });
    release(command);
    parsed
}

/// Whether `--format` appears more than once before `--` (what follows belongs to a host).
fn format_given_twice(args: &[OsString]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .filter(|a| {
            a.to_str()
                .is_some_and(|a| a == "--format" || a.starts_with("--format="))
        })
        .count()
        > 1
}

/// The whole tree, pruned to the top-level subcommand `args` invoke when they name one (the
/// whole tree then goes to `release`).
fn tree_for(args: &[OsString], release: fn(clap::Command)) -> clap::Command {
    let whole = Cli::command();
    let Some(invoked) = invoked_subcommand(&whole, args)
        .and_then(|name| whole.find_subcommand(name))
        .cloned()
    else {
        return whole;
    };
    // The top level's own `--help` and `--version` never reach here (`invoked_subcommand`), so
    // its name, flags and groups are all of it that parsing the subcommand can see.
    let pruned = clap::Command::new(BIN_NAME)
        .args(whole.get_arguments().cloned())
        .groups(whole.get_groups().cloned())
        .subcommand(invoked);
    release(whole);
    pruned
}

/// The first word of `args` (after the program name) that is not a top-level flag or its value,
/// when everything before it is one of the tree's global flags. `None` when a help, version or
/// unknown flag, a `--`, or no word at all comes first.
fn invoked_subcommand<'a>(whole: &clap::Command, args: &'a [OsString]) -> Option<&'a str> {
    let globals: Vec<&clap::Arg> = whole
        .get_arguments()
        .filter(|a| a.is_global_set())
        .collect();
    // `-q` and `-v` are `Set` actions of no values (see `Cli`): switches, as `SetTrue` ones are.
    let takes_value = |a: &clap::Arg| {
        a.get_action().takes_values() && a.get_num_args().is_none_or(|n| n.takes_values())
    };
    let mut words = args.iter().skip(1);
    while let Some(word) = words.next() {
        let word = word.to_str()?;
        if let Some(long) = word.strip_prefix("--") {
            let (name, inline_value) = match long.split_once('=') {
                Some((name, _)) => (name, true),
                None => (long, false),
            };
            let arg = globals.iter().find(|a| a.get_long() == Some(name))?;
            if takes_value(arg) && !inline_value {
                words.next()?;
            }
        } else if let Some(shorts) = word.strip_prefix('-') {
            // A cluster of global switches (`-q`, `-qv`); a short flag that takes a value, or
            // any other, goes to the whole tree.
            let all_switches = !shorts.is_empty()
                && shorts.chars().all(|c| {
                    globals
                        .iter()
                        .any(|a| a.get_short() == Some(c) && !takes_value(a))
                });
            if !all_switches {
                return None;
            }
        } else {
            return Some(word);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::Command;
    use super::*;

    /// Every path of subcommands in the tree, from the top (`["todo", "claim"]`, ...).
    fn paths(cmd: &clap::Command, prefix: &[String], out: &mut Vec<Vec<String>>) {
        for sub in cmd.get_subcommands() {
            let mut path = prefix.to_vec();
            path.push(sub.get_name().to_owned());
            out.push(path.clone());
            let mut built = sub.clone();
            built.build();
            paths(&built, &path, out);
        }
    }

    fn outcome(args: &[&str], whole: bool) -> String {
        let args: Vec<OsString> = std::iter::once("loopx")
            .chain(args.iter().copied())
            .map(OsString::from)
            .collect();
        let parsed = if whole {
            let mut command = Cli::command();
            command
                .try_get_matches_from_mut(args)
                .and_then(|mut m| Cli::from_arg_matches_mut(&mut m))
        } else {
            parse_from(args, drop)
        };
        match parsed {
            Ok(cli) => format!("{cli:?}"),
            Err(e) => format!("{:?}\n{}", e.kind(), e.render()),
        }
    }

    #[test]
    fn a_format_after_the_hosts_double_dash_is_the_hosts() {
        let args = |words: &[&str]| -> Vec<OsString> {
            std::iter::once("loopx")
                .chain(words.iter().copied())
                .map(OsString::from)
                .collect()
        };
        assert!(!format_given_twice(&args(&[
            "--format", "json", "turn", "run", "--", "h", "--format", "x"
        ])));
        assert!(format_given_twice(&args(&[
            "--format=json",
            "status",
            "--format",
            "text"
        ])));
        assert!(!format_given_twice(&args(&["status", "--format", "json"])));
    }

    #[test]
    fn the_pruned_tree_parses_helps_and_fails_as_the_whole_tree_does() {
        let mut all = Vec::new();
        let mut whole = Cli::command();
        whole.build();
        paths(&whole, &[], &mut all);
        assert!(all.len() > 60, "{}", all.len());
        let mut pruned_runs = 0;
        for path in &all {
            let words: Vec<&str> = path.iter().map(String::as_str).collect();
            let tails: [&[&str]; 8] = [
                &[],
                &["--help"],
                &["-h"],
                &["--goal-id", "g", "--todo-id", "t", "--agent-id", "a"],
                &["--no-such-flag"],
                &["--format", "json", "--goal-id"],
                &["-q", "--format=yaml"],
                &["-qv"],
            ];
            for tail in tails {
                for lead in [
                    &[][..],
                    &["--format", "json"],
                    &["-q"],
                    &["--root=/nowhere"],
                ] {
                    let args: Vec<&str> = [lead, &words[..], tail].concat();
                    let full: Vec<OsString> = std::iter::once("loopx")
                        .chain(args.iter().copied())
                        .map(OsString::from)
                        .collect();
                    if invoked_subcommand(&whole, &full).is_some() {
                        pruned_runs += 1;
                    }
                    assert_eq!(
                        outcome(&args, false),
                        outcome(&args, true),
                        "loopx {}",
                        args.join(" ")
                    );
                }
            }
        }
        assert!(pruned_runs > all.len() * 20, "{pruned_runs}");
    }

    /// `--format`, `-q` and `-v` leave no match at any level when not given (see `Cli`): a
    /// default would be copied into every level of the invoked subcommand by every command.
    /// Given, they read as the flags say.
    #[test]
    fn global_flags_not_given_leave_no_match_and_read_as_given() {
        use super::super::{Verbosity, output::Format};
        let matches = Cli::command()
            .try_get_matches_from(["loopx", "todo", "list", "--goal-id", "g"])
            .unwrap();
        let mut level = Some(&matches);
        let mut levels = 0;
        while let Some(m) = level {
            for id in ["format", "quiet", "verbose"] {
                assert_eq!(m.value_source(id), None, "{id} at level {levels}");
            }
            levels += 1;
            level = m.subcommand().map(|(_, sub)| sub);
        }
        assert_eq!(levels, 3);
        let read = |args: &[&str]| {
            let args = std::iter::once("loopx")
                .chain(args.iter().copied())
                .map(OsString::from)
                .collect();
            let cli = parse_from(args, drop).unwrap();
            (cli.format(), cli.verbosity())
        };
        assert_eq!(read(&["status"]), (Format::Text, Verbosity::Normal));
        assert_eq!(read(&["-q", "status"]), (Format::Text, Verbosity::Quiet));
        assert_eq!(
            read(&["status", "--verbose", "--format", "json"]),
            (Format::Json, Verbosity::Verbose)
        );
        assert_eq!(
            read(&["--format=markdown", "status", "--quiet"]),
            (Format::Markdown, Verbosity::Quiet)
        );
    }

    #[test]
    fn only_a_leading_run_of_global_flags_reaches_the_pruned_tree() {
        let whole = Cli::command();
        let invoked = |args: &[&str]| {
            let args: Vec<OsString> = std::iter::once("loopx")
                .chain(args.iter().copied())
                .map(OsString::from)
                .collect();
            invoked_subcommand(&whole, &args).map(str::to_owned)
        };
        assert_eq!(invoked(&["todo", "list"]).as_deref(), Some("todo"));
        assert_eq!(
            invoked(&["--format", "json", "-qv", "--root=/x", "quota"]).as_deref(),
            Some("quota")
        );
        assert_eq!(
            invoked(&["--root", "todo", "list"]).as_deref(),
            Some("list")
        );
        for args in [
            &[][..],
            &["--help"],
            &["-V"],
            &["--format"],
            &["-x", "todo"],
            &["--", "todo"],
            &["--formats", "json", "todo"],
        ] {
            assert_eq!(invoked(args), None, "{args:?}");
        }
        // Whatever word comes first is looked up; a word that names no subcommand leaves the
        // whole tree to say so.
        assert!(whole.find_subcommand("tood").is_none());
        assert!(matches!(
            parse_from(
                ["loopx", "quota", "should-run", "--goal-id", "g"]
                    .map(OsString::from)
                    .to_vec(),
                drop
            ),
            Ok(Cli {
                command: Command::Quota(_),
                ..
            })
        ));
    }
}
