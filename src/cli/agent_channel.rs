//! The CLI on both ends of the agent channel (`crate::turn::channel`): inside a turn, `loopx`
//! forwards its arguments to the driver; the driver runs them here as the turn's agent.
//!
//! Only agent work is served: reading state and the todo, evidence, quota and run commands, each
//! as the turn's agent holding the turn's lease. Operator commands among them (`gate resolve`,
//! `quota set`, `reward add`, `goal close`, ...) refuse an agent in the kernel as they always do;
//! commands that are not agent work at all are refused here, before they are parsed further.

use clap::Parser;

use super::output::Format;
use super::{Cli, Command, Context, Nested, argument_error_text, dispatch, error_text};
use crate::error::{LoopxError, Result, refused};
use crate::paths::ProjectPaths;
use crate::turn::channel::{self, ChannelResponse, TurnIdentity};

/// `loopx` inside a turn: when the driver named a channel, the command runs there. `None` when
/// this process is not inside a turn (the command runs here as usual).
pub fn forward_if_inside_turn() -> Option<i32> {
    let socket = std::env::var_os(channel::SOCKET_ENV).filter(|s| !s.is_empty())?;
    let argv: Option<Vec<String>> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().ok())
        .collect();
    let result = match argv {
        Some(argv) => channel::call(std::path::Path::new(&socket), argv),
        None => Err(crate::error::bad_input(
            "an argument is not valid UTF-8: the agent channel carries text only",
        )),
    };
    let response = result.unwrap_or_else(|err| {
        // The request did not get far enough for the driver to read `--format`.
        let format = if super::json_requested(std::env::args_os()) {
            Format::Json
        } else {
            Format::Text
        };
        let (stdout, stderr) = error_text(&err, format);
        ChannelResponse {
            code: err.exit_code(),
            stdout: stdout.unwrap_or_default(),
            stderr,
        }
    });
    use std::io::Write;
    let _ = std::io::stdout().write_all(response.stdout.as_bytes());
    let _ = std::io::stderr().write_all(response.stderr.as_bytes());
    Some(response.code)
}

/// Runs one request from a turn's host (installed with `channel::install_handler`).
pub fn serve(paths: &ProjectPaths, identity: &TurnIdentity, argv: &[String]) -> ChannelResponse {
    let cli = match Cli::try_parse_from(
        std::iter::once("loopx").chain(argv.iter().map(String::as_str)),
    ) {
        Ok(cli) => cli,
        Err(e) => {
            let (stdout, stderr, code) = if e.use_stderr() {
                let args = std::iter::once("loopx".into()).chain(argv.iter().map(Into::into));
                let (stdout, stderr) = argument_error_text(&e, args);
                (stdout.unwrap_or_default(), stderr, 2)
            } else {
                (e.render().to_string(), String::new(), 0)
            };
            return ChannelResponse {
                code,
                stdout,
                stderr,
            };
        }
    };
    let format = cli.format();
    let result = served(&cli.command).and_then(|()| {
        let ctx = Context::for_turn(paths, identity, format);
        dispatch(&ctx, cli.command, not_on_the_channel)
    });
    match result {
        Ok(output) => ChannelResponse {
            code: output.exit_code,
            stdout: output.render(format),
            stderr: String::new(),
        },
        Err(err) => {
            let (stdout, stderr) = error_text(&err, format);
            ChannelResponse {
                code: err.exit_code(),
                stdout: stdout.unwrap_or_default(),
                stderr,
            }
        }
    }
}

/// The commands a host may run during its turn.
fn served(command: &Command) -> Result<()> {
    let name = match command {
        Command::Goal(_)
        | Command::ProjectPrompt(_)
        | Command::Todo(_)
        | Command::Gate(_)
        | Command::Quota(_)
        | Command::RefreshState(_)
        | Command::History(_)
        | Command::Reward(_)
        | Command::SummaryAll(_)
        | Command::Status(_)
        | Command::Probe(_)
        | Command::Completions(_) => return Ok(()),
        Command::Init(_) => "init",
        Command::StartGoal(_) => "start-goal",
        Command::Doctor(_) => "doctor",
        Command::Turn(_) => "turn",
        Command::Loop(_) => "loop",
        Command::Extension(Nested { .. }) => "extension",
        Command::Capability(_) => "capability",
        Command::Provider(_) => "provider",
        Command::Backup(_) => "backup",
        // `man --out` writes files with the driver's rights, outside the host's isolation.
        Command::Man(_) => "man",
        // It reads any path it is given, with the driver's rights.
        Command::InspectRegistry(_) => "inspect_registry",
        Command::Gc(_) => "gc",
        Command::Serve(_) => "serve",
    };
    Err(refused(format!(
        "`loopx {name}` is not available inside a turn: a host works its todo through the agent \
         channel; the operator runs `{name}` outside the turn"
    )))
}

fn not_on_the_channel(_: &Context, _: Command) -> Result<super::output::Output> {
    Err(LoopxError::Refused(
        "WebAssembly commands are not available inside a turn".into(),
    ))
}
