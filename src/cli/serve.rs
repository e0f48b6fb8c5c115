//! `loopx serve`: the read-only web dashboard, and the bridge its JSON API answers through.
//!
//! The HTTP server lives in its own executable, `loopx-serve`, installed beside `loopx` (as
//! `loopx-wasm` is), so the kernel binary links no HTTP stack and keeps its start-up time;
//! `loopx serve` replaces itself with it. The dashboard's API does not build JSON of its own:
//! [`api_read`] runs the matching read-only CLI command in-process with `--format json` and
//! returns exactly what the command prints, so the API and the CLI cannot drift apart
//! (docs/decisions.md, "The dashboard's API runs the CLI's read-only commands in-process").

use std::path::PathBuf;

use clap::Parser;

use super::output::{Format, Output};
use super::{Cli, Command, Context, Nested, Verbosity};
use crate::error::{LoopxError, Result, bad_input};
use crate::paths::ProjectPaths;

/// The name of the dashboard's executable, installed beside `loopx`.
pub const SERVE_BINARY: &str = "loopx-serve";

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address and port to listen on (default 127.0.0.1:7878); an address other than loopback
    /// requires --token or --token-file.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// Token every request must carry (`Authorization: Bearer TOKEN`, or `?token=TOKEN` once,
    /// which sets a cookie). Visible to other local users in the process list: prefer --token-file.
    #[arg(long, value_name = "TOKEN", conflicts_with = "token_file")]
    pub token: Option<String>,
    /// File holding the token (its first line).
    #[arg(long, value_name = "FILE", value_parser = super::flags::path)]
    pub token_file: Option<PathBuf>,
}

/// Replaces this process with `loopx-serve` from the directory of the running `loopx`, passing
/// the project it resolved and the flags. Returns only when the exec fails.
pub fn run(ctx: &Context, args: ServeArgs) -> Result<Output> {
    use std::os::unix::process::CommandExt;
    let paths = ctx.paths()?;
    // Opened as by every command: a damaged project is reported here, and an older schema is
    // brought up to date, which the server itself never does (it only reads).
    ctx.kernel()?;
    let exe = std::env::current_exe()
        .map_err(|e| LoopxError::internal("locating the loopx binary", e))?;
    let server = exe.with_file_name(SERVE_BINARY);
    let mut command = std::process::Command::new(&server);
    command.arg("--root").arg(&paths.project);
    if ctx.format == Format::Json {
        command.args(["--format", "json"]);
    }
    if let Some(listen) = &args.listen {
        command.arg("--listen").arg(listen);
    }
    if let Some(token) = &args.token {
        command.arg("--token").arg(token);
    }
    if let Some(file) = &args.token_file {
        command.arg("--token-file").arg(ctx.absolute(file)?);
    }
    let err = command.exec();
    Err(crate::error::not_found(format!(
        "cannot run {} ({err}): the dashboard runs in `{SERVE_BINARY}`, which is built by the \
         workspace and installed beside `loopx`; build it with `cargo build --release -p \
         loopx-serve` (or `cargo build` in the workspace), or install it with `cargo install \
         --path serve`",
        server.display()
    )))
}

/// Runs one read-only command (`args` is its argv without the program name, e.g.
/// `["todo", "list", "--goal-id=g"]`) on the project at `paths` and returns what
/// `loopx --format json` prints for it. A command that could write is refused before it runs,
/// as is anything that does not parse. A failed command is an `Err` whose JSON envelope
/// [`error_json`] gives.
pub fn api_read(paths: &ProjectPaths, args: &[String]) -> Result<String> {
    let root = paths.project.to_string_lossy().into_owned();
    let argv = ["loopx", "--format", "json", "--root", root.as_str()]
        .into_iter()
        .map(str::to_string)
        .chain(args.iter().cloned());
    let cli = Cli::try_parse_from(argv).map_err(|e| {
        bad_input(format!(
            "the API request does not name a valid read: {}",
            e.render().to_string().lines().next().unwrap_or_default()
        ))
    })?;
    if !is_read_only(&cli.command) {
        return Err(bad_input(format!(
            "`loopx {}` is not one of the read-only commands the dashboard's API runs",
            args.first().map(String::as_str).unwrap_or_default()
        )));
    }
    let ctx = Context::from_env(Some(paths.project.clone()), Verbosity::Quiet, Format::Json)?
        .without_schema_upgrade();
    let output = super::dispatch(&ctx, cli.command, super::run_wasm_command)?;
    Ok(output.render(Format::Json))
}

/// One run's report: the run as `history` lists it (`run_json` with its `rewards`), found by
/// its id, and `evidence`, what its todo held when it was recorded (`Kernel::run_detail`). No
/// CLI command shows a single run; this is the one API answer built here, from the same
/// builders.
pub fn run_report(paths: &ProjectPaths, goal_id: &str, run_id: &str) -> Result<String> {
    let kernel =
        crate::kernel::Kernel::open_with(paths.clone(), crate::kernel::SchemaUpgrade::Refuse)?;
    let detail = kernel.run_detail(goal_id, run_id)?.ok_or_else(|| {
        crate::error::not_found(format!(
            "unknown run '{run_id}' in goal '{goal_id}'; `loopx history --goal-id {goal_id}` \
             lists its runs"
        ))
    })?;
    let mut run = crate::kernel::projection::run_json(&detail.run);
    run["rewards"] = serde_json::json!(detail.rewards);
    let evidence: Vec<_> = detail
        .evidence
        .iter()
        .map(crate::kernel::projection::evidence_json)
        .collect();
    let value = serde_json::json!({
        "goal_id": goal_id,
        "run": run,
        "evidence": evidence,
    });
    Ok(Output::new(value).render(Format::Json))
}

/// The JSON error envelope `loopx --format json` prints for `err`.
pub fn error_json(err: &LoopxError) -> String {
    super::error_text(err, Format::Json)
        .0
        .expect("the JSON format always has an envelope")
}

/// The commands the API may run: each one only reads.
fn is_read_only(command: &Command) -> bool {
    use super::extension::ExtensionCommand as E;
    use super::gate::GateCommand as G;
    use super::goal::GoalCommand as Go;
    use super::quota::QuotaCommand as Q;
    use super::todo::TodoCommand as T;
    use super::turn::TurnCommand as Tu;
    match command {
        Command::Status(_) | Command::History(_) | Command::SummaryAll(_) => true,
        Command::Goal(Nested { command }) => matches!(command, Go::List | Go::Show { .. }),
        Command::Todo(Nested { command }) => matches!(command, T::List { .. } | T::Show { .. }),
        Command::Gate(Nested { command }) => matches!(command, G::List { .. }),
        Command::Quota(Nested { command }) => {
            matches!(command, Q::Show { .. } | Q::ShouldRun { .. })
        }
        Command::Turn(Nested { command }) => {
            matches!(command, Tu::List { .. } | Tu::Inspect { .. })
        }
        Command::Extension(Nested { command }) => matches!(command, E::List | E::Inspect { .. }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::test_project;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_api_runs_read_commands_and_prints_what_the_cli_prints() {
        let (dir, _kernel) = test_project::with_goal_g();
        let paths = ProjectPaths::at(dir.path());
        let text = api_read(&paths, &args(&["goal", "show", "--goal-id=g"])).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["ok"], true);
        assert_eq!(value["goal"]["id"], "g");
    }

    #[test]
    fn the_api_refuses_every_command_that_could_write_before_it_runs() {
        let (dir, _kernel) = test_project::with_goal_g();
        let paths = ProjectPaths::at(dir.path());
        for argv in [
            &["goal", "close", "--goal-id=g"][..],
            &["todo", "add", "--goal-id=g", "--title=x"],
            &["quota", "spend-slot", "--goal-id=g"],
            &["refresh-state"],
            &["init"],
            &["todo", "claim", "--goal-id=g"],
            &[
                "gate",
                "resolve",
                "--goal-id=g",
                "--todo-id=t",
                "--comment=x",
            ],
            &["reward", "add", "--goal-id=g", "--run-id=r", "--score=1"],
            &["turn", "recover"],
            &["extension", "remove", "x"],
            &["backup", "copy.db"],
            &["serve"],
        ] {
            let err = api_read(&paths, &args(argv)).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{argv:?}: {err}");
        }
        let goal = crate::kernel::Kernel::open(paths)
            .unwrap()
            .goal("g")
            .unwrap();
        assert_eq!(goal.status.to_string(), "active");
    }

    #[test]
    fn a_failed_read_is_the_cli_error_envelope() {
        let (dir, _kernel) = test_project::with_goal_g();
        let paths = ProjectPaths::at(dir.path());
        let err = api_read(&paths, &args(&["goal", "show", "--goal-id=nope"])).unwrap_err();
        let value: serde_json::Value = serde_json::from_str(&error_json(&err)).unwrap();
        assert_eq!(value["ok"], false);
        assert_eq!(value["error"]["kind"], "not_found");
        let err = run_report(&paths, "g", "01NOPE").unwrap_err();
        assert_eq!(err.exit_code(), 3, "{err}");
    }
}
