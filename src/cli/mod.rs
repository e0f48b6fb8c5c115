//! The `loopx` command line: argument parsing, the per-command modules, and error reporting.
//!
//! Each command lives in its own file and does three things: turn flags into a kernel call, make
//! the call, and describe the result as an [`output::Output`]. Policy never lives here.

mod agent_channel;
mod backup;
mod capability;
mod completions;
mod doctor;
mod extension;
mod flags;
mod gate;
mod gc;
mod goal;
mod history;
mod init;
mod inspect_registry;
mod loop_cmd;
mod man;
mod next_action;
pub mod output;
mod parse;
mod probe;
mod project_prompt;
mod provider;
mod quota;
mod refresh_state;
mod reward;
pub mod serve;
mod start_goal;
mod status;
mod summary;
mod todo;
mod turn;
mod watch;

use std::cell::{OnceCell, RefCell, RefMut};
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::error::{LoopxError, Result};
use crate::kernel::claim::agent_actor;
use crate::kernel::{Actor, DEFAULT_AGENT_ID, Kernel};
use crate::paths::ProjectPaths;
use crate::turn::channel::TurnIdentity;
use output::{Format, Output};

/// The executable's name, as clap shows it in usage lines and help.
pub(crate) const BIN_NAME: &str = "loopx";

#[derive(Debug, Parser)]
#[command(
    name = BIN_NAME,
    version,
    about = "The control plane for long-running AI agent work"
)]
pub struct Cli {
    /// Project directory holding `.loopx/` (default: search upward from the working directory).
    #[arg(long, global = true, env = "LOOPX_ROOT", value_name = "DIR", value_parser = flags::root)]
    pub root: Option<PathBuf>,
    // `--format`, `-q` and `-v` hold nothing when not given (no clap default, `Option`): clap
    // copies every global argument that has a match, a default included, into each level of the
    // invoked subcommand, and those copies were a visible share of a short command's
    // instructions (docs/benchmarks.md). Read them through `format()` and `verbosity()`.
    /// Output format [default: text].
    #[arg(long, global = true, value_enum)]
    pub format: Option<Format>,
    /// Print less: no progress or per-turn lines on stderr; the command's output, errors and
    /// warnings are still printed.
    #[arg(short, long, global = true, conflicts_with = "verbose", action = clap::ArgAction::Set, num_args = 0, default_missing_value = "true")]
    pub quiet: Option<bool>,
    /// Print more on stderr: the project used and how long the command took.
    #[arg(short, long, global = true, action = clap::ArgAction::Set, num_args = 0, default_missing_value = "true")]
    pub verbose: Option<bool>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
#[command(defer = true)]
pub enum Command {
    /// Create `.loopx/` (database and projections) in the project directory.
    Init(init::InitArgs),
    /// Create, list, show, close, pause and resume goals.
    Goal(Nested<goal::GoalCommand>),
    /// Seed-compatible alias of `goal` (create --title --description, list --json, close).
    #[command(name = "project_prompt")]
    ProjectPrompt(Nested<project_prompt::ProjectPromptCommand>),
    /// Initialize the project if needed and create a goal from free text.
    #[command(name = "start-goal")]
    StartGoal(start_goal::StartGoalArgs),
    /// Add, list, claim, renew, release, update and complete todos.
    Todo(Nested<todo::TodoCommand>),
    /// List and resolve user gates (operators only).
    Gate(Nested<gate::GateCommand>),
    /// Quota policy, the should-run decision, and the spend ledger.
    Quota(Nested<quota::QuotaCommand>),
    /// Record a run and rewrite the goal's projections (or re-create every projection).
    #[command(name = "refresh-state")]
    RefreshState(refresh_state::RefreshStateArgs),
    /// Run history with reward overlays, newest first.
    History(history::HistoryArgs),
    /// Human reward overlays on runs.
    Reward(Nested<reward::RewardCommand>),
    /// Evidence, rewards, runs and quota of one goal.
    #[command(name = "summary_all")]
    SummaryAll(summary::SummaryArgs),
    /// The attention queue: who must act next, on which goal.
    Status(status::StatusArgs),
    /// The goal's stored next probe (shown, never executed).
    Probe(Nested<probe::ProbeCommand>),
    /// Check the project: database integrity, schema, projections.
    Doctor(doctor::DoctorArgs),
    /// Write a consistent copy of the database to a new file (SQLite's online backup).
    Backup(backup::BackupArgs),
    /// Retention: compact old turn journals, retire old run report files, vacuum (dry run
    /// unless --apply); `gc policy` shows or sets the policy (operators only).
    Gc(gc::GcArgs),
    /// Plan, run, recover and inspect bounded agent turns.
    Turn(Nested<turn::TurnCommand>),
    /// Run turns under a bounded budget until done, idle, or interrupted.
    Loop(loop_cmd::LoopArgs),
    /// Scaffold, install, inspect, enable/disable, upgrade, roll back and remove WASM extensions.
    Extension(Nested<extension::ExtensionCommand>),
    /// Run a capability on a goal and show the kernel's verdict on each proposal.
    Capability(Nested<capability::CapabilityCommand>),
    /// Call a provider once and print its observation.
    Provider(Nested<provider::ProviderCommand>),
    /// Print the shell completion script for bash, zsh, fish, powershell or elvish.
    Completions(completions::CompletionsArgs),
    /// Print the manual page (roff), or write one page per command with --out DIR.
    Man(man::ManArgs),
    /// Check a registry projection (default: the project's) and list its goals and typed
    /// problems; exit 5 when it has problems.
    #[command(name = "inspect_registry")]
    InspectRegistry(inspect_registry::InspectRegistryArgs),
    /// Serve the read-only web dashboard and its JSON API (runs `loopx-serve`, beside `loopx`).
    Serve(serve::ServeArgs),
}

// A command group (`goal`, `todo`, `quota`, ...) as an argument struct rather than a
// `#[command(subcommand)]` variant, so that `#[command(defer = true)]` on `Command` covers it too:
// clap then builds only the group the command line names, not all seventy-odd commands, which is
// a measurable part of every short process (docs/decisions.md). A plain comment, not a doc
// comment: clap would show a doc comment as the group's description.
#[derive(Debug, clap::Args)]
pub struct Nested<T: Subcommand> {
    #[command(subcommand)]
    pub command: T,
}

impl Cli {
    /// `--format`, text when not given.
    pub fn format(&self) -> Format {
        self.format.unwrap_or(Format::Text)
    }

    /// `-q` or `-v` (clap refuses both).
    pub fn verbosity(&self) -> Verbosity {
        match (self.quiet, self.verbose) {
            (Some(true), _) => Verbosity::Quiet,
            (_, Some(true)) => Verbosity::Verbose,
            _ => Verbosity::Normal,
        }
    }
}

/// How much a command prints beside its output (`-q`, `-v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verbosity {
    /// No progress, no per-turn or log lines; errors and warnings only.
    Quiet,
    Normal,
    /// Also the project used and the command's duration.
    Verbose,
}

/// What every command may need: where to find the project, who is calling, and the project's
/// kernel, opened on first use and kept for the rest of the process.
pub struct Context {
    pub root: Option<PathBuf>,
    /// The working directory, read on first use: most commands never need it, and one given an
    /// absolute root works after its directory was deleted.
    cwd: OnceCell<PathBuf>,
    pub verbosity: Verbosity,
    /// `--format`, for commands that print as they go (`--watch`).
    pub format: Format,
    /// `LOOPX_TURN_KEY`: set by the turn driver for the agent host it runs.
    pub turn_key: Option<String>,
    /// `LOOPX_AGENT_ID`: the agent identity of this process, when it has one.
    pub env_agent_id: Option<String>,
    /// `LOOPX_CLAIM_KEY`: the lease proof the turn driver hands its host.
    pub env_claim_key: Option<String>,
    /// A request on a turn's agent channel: every command acts as this agent with this lease,
    /// whatever its flags say.
    turn: Option<TurnIdentity>,
    /// Whether opening the project may migrate its schema: refused for the dashboard's reads.
    schema_upgrade: crate::kernel::SchemaUpgrade,
    kernel: OnceCell<RefCell<Kernel>>,
}

/// One of the variables that say who a process acts as: unset or empty is none; a value that is
/// not UTF-8 is refused rather than read as unset, which would have the process act as the
/// operator instead of the agent the variable names.
fn identity_var(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(value) => Ok(Some(value).filter(|v| !v.is_empty())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(crate::error::bad_input(format!(
            "the environment variable {name} is not valid UTF-8; set it to a UTF-8 value or unset it"
        ))),
    }
}

impl Context {
    fn from_env(root: Option<PathBuf>, verbosity: Verbosity, format: Format) -> Result<Context> {
        Ok(Context {
            root,
            cwd: OnceCell::new(),
            verbosity,
            format,
            turn_key: identity_var("LOOPX_TURN_KEY")?,
            env_agent_id: identity_var("LOOPX_AGENT_ID")?,
            env_claim_key: identity_var("LOOPX_CLAIM_KEY")?,
            turn: None,
            schema_upgrade: crate::kernel::SchemaUpgrade::Apply,
            kernel: OnceCell::new(),
        })
    }

    /// The context of one request on a turn's agent channel (served by the driver).
    fn for_turn(paths: &ProjectPaths, identity: &TurnIdentity, format: Format) -> Context {
        Context {
            root: Some(paths.project.clone()),
            cwd: OnceCell::from(paths.project.clone()),
            verbosity: Verbosity::Normal,
            format,
            turn_key: Some(identity.turn_key.clone()),
            env_agent_id: Some(identity.agent_id.clone()),
            env_claim_key: Some(identity.claim_key.clone()),
            turn: Some(identity.clone()),
            schema_upgrade: crate::kernel::SchemaUpgrade::Apply,
            kernel: OnceCell::new(),
        }
    }

    /// This context opens the project without ever migrating its schema (an older one is
    /// refused): for the dashboard's API, which must never write.
    pub fn without_schema_upgrade(mut self) -> Context {
        self.schema_upgrade = crate::kernel::SchemaUpgrade::Refuse;
        self
    }

    /// Whether this context serves a request on a turn's agent channel.
    pub fn in_turn(&self) -> bool {
        self.turn.is_some()
    }

    /// A progress line on stderr for long work (compiling a component, waiting for work): only
    /// when stderr is a terminal a person watches, never with `--quiet`, never into a log or a
    /// pipe a script reads.
    pub fn progress(&self, text: &str) {
        use std::io::{IsTerminal, Write};
        let err = std::io::stderr();
        if self.verbosity != Verbosity::Quiet && err.is_terminal() {
            let _ = writeln!(err.lock(), "loopx: {}", crate::inert::line(text));
        }
    }

    /// A detail line on stderr with `--verbose` (the project used, timings).
    pub fn detail(&self, text: &str) {
        use std::io::Write;
        if self.verbosity == Verbosity::Verbose {
            let _ = writeln!(
                std::io::stderr().lock(),
                "loopx: {}",
                crate::inert::line(text)
            );
        }
    }

    pub fn paths(&self) -> Result<ProjectPaths> {
        ProjectPaths::discover(self.root.as_deref(), || self.cwd().map(Path::to_path_buf))
    }

    /// The working directory (see the field).
    pub fn cwd(&self) -> Result<&Path> {
        if let Some(cwd) = self.cwd.get() {
            return Ok(cwd);
        }
        let cwd = crate::paths::working_directory()?;
        Ok(self.cwd.get_or_init(|| cwd))
    }

    /// `path` as given when absolute, else under the working directory.
    pub fn absolute(&self, path: &Path) -> Result<PathBuf> {
        if path.is_absolute() {
            Ok(path.to_path_buf())
        } else {
            Ok(self.cwd()?.join(path))
        }
    }

    /// The project's kernel, opened by the first call. One borrow at a time: a command takes it,
    /// uses it, and lets it go before anything else asks.
    pub fn kernel(&self) -> Result<RefMut<'_, Kernel>> {
        let kernel = match self.kernel.get() {
            Some(kernel) => kernel,
            None => {
                let opened = Kernel::open_with(self.paths()?, self.schema_upgrade)?;
                self.kernel.get_or_init(|| RefCell::new(opened))
            }
        };
        Ok(kernel
            .try_borrow_mut()
            .expect("a command holds at most one borrow of the kernel"))
    }

    /// Whether this process committed a write (see [`Kernel::has_committed`]).
    fn has_committed(&self) -> bool {
        self.kernel
            .get()
            .and_then(|k| k.try_borrow().ok().map(|k| k.has_committed()))
            .unwrap_or(false)
    }

    fn take_warnings(&self) -> Vec<String> {
        self.kernel
            .get()
            .and_then(|k| k.try_borrow_mut().ok().map(|mut k| k.take_warnings()))
            .map(|warnings| warnings.iter().map(next_action::message_text).collect())
            .unwrap_or_default()
    }

    /// Ends the process's use of the kernel without closing the store. The process exits next,
    /// and the exit releases everything closing would (SQLite's locks, mappings, descriptors and
    /// memory); closing does no durable work here, as every transaction has committed or rolled
    /// back by now and a close never checkpoints (`SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`). What closing
    /// cost is in docs/benchmarks.md. Only the process's own `main` may call this: a long-lived
    /// caller would leak a connection per call.
    fn release_at_exit(self) {
        std::mem::forget(self.kernel);
    }

    /// The goal a command acts on when `--goal-id` may be left out: the flag when given; inside
    /// a turn, the turn's goal; otherwise the project's only active goal. With none or several
    /// active goals it is bad input that names the choices. Takes the kernel the command already
    /// holds (one borrow at a time).
    pub fn goal_id(&self, kernel: &Kernel, flag: Option<String>) -> Result<String> {
        if let Some(id) = flag {
            return Ok(id);
        }
        if let Some(turn) = &self.turn {
            return Ok(turn.goal_id.clone());
        }
        let active: Vec<String> = kernel
            .goals()?
            .into_iter()
            .filter(|g| g.status == crate::model::GoalStatus::Active)
            .map(|g| g.id)
            .collect();
        const NAMED: usize = 10;
        match active.as_slice() {
            [only] => Ok(only.clone()),
            [] => Err(crate::error::bad_input(
                "--goal-id is required: the project has no active goal; create one with \
                 `loopx goal create --title ...` or name a paused one with --goal-id",
            )),
            many => {
                let mut names = many[..many.len().min(NAMED)].join(", ");
                if many.len() > NAMED {
                    names.push_str(&format!(
                        " and {} more (`loopx goal list`)",
                        many.len() - NAMED
                    ));
                }
                Err(crate::error::bad_input(format!(
                    "--goal-id is required: the project has {} active goals: {names}; name one \
                     with --goal-id",
                    many.len()
                )))
            }
        }
    }

    /// The agent this process acts as for claims and decisions (flag, then env, then default).
    pub fn agent_id(&self, flag: Option<&str>) -> String {
        if let Some(turn) = &self.turn {
            return turn.agent_id.clone();
        }
        flag.map(str::to_string)
            .or_else(|| self.env_agent_id.clone())
            .unwrap_or_else(|| DEFAULT_AGENT_ID.to_string())
    }

    /// Who a write comes from: an agent when `--agent-id` is given or the process runs inside a
    /// turn (`LOOPX_TURN_KEY`/`LOOPX_AGENT_ID`), otherwise the operator at the terminal.
    pub fn actor(
        &self,
        agent_flag: Option<&str>,
        fence: Option<i64>,
        claim_key: Option<String>,
    ) -> Actor {
        if let Some(turn) = &self.turn {
            return agent_actor(
                &turn.agent_id,
                fence,
                claim_key.or_else(|| Some(turn.claim_key.clone())),
                Some(turn.turn_key.clone()),
            );
        }
        if agent_flag.is_none() && self.turn_key.is_none() && self.env_agent_id.is_none() {
            return Actor::Operator;
        }
        let claim_key = claim_key.or_else(|| self.env_claim_key.clone());
        agent_actor(
            &self.agent_id(agent_flag),
            fence,
            claim_key,
            self.turn_key.clone(),
        )
    }

    /// The actor for operator-only commands (no agent flags exist on them).
    pub fn operator_or_agent(&self) -> Actor {
        self.actor(None, None, None)
    }
}

/// Runs a command that executes WebAssembly (`turn`, `loop`, `extension`, `capability`,
/// `provider`). The `loopx` binary passes [`exec_wasm_host`]; `loopx-wasm` passes
/// [`run_wasm_command`]. Taking it as a parameter keeps the engine out of the kernel binary
/// entirely: the linker drops code nothing refers to.
pub type WasmDispatch = fn(&Context, Command) -> Result<Output>;

/// The name of the binary that hosts the WebAssembly engine, installed beside `loopx`.
pub const WASM_HOST_BINARY: &str = "loopx-wasm";

fn dispatch(ctx: &Context, command: Command, wasm: WasmDispatch) -> Result<Output> {
    match command {
        Command::Init(args) => init::run(ctx, args),
        Command::Goal(Nested { command: cmd }) => goal::run(ctx, cmd),
        Command::ProjectPrompt(Nested { command: cmd }) => project_prompt::run(ctx, cmd),
        Command::StartGoal(args) => start_goal::run(ctx, args),
        Command::Todo(Nested { command: cmd }) => todo::run(ctx, cmd),
        Command::Gate(Nested { command: cmd }) => gate::run(ctx, cmd),
        Command::Quota(Nested { command: cmd }) => quota::run(ctx, cmd),
        Command::RefreshState(args) => refresh_state::run(ctx, args),
        Command::History(args) => history::run(ctx, args),
        Command::Reward(Nested { command: cmd }) => reward::run(ctx, cmd),
        Command::SummaryAll(args) => summary::run(ctx, args),
        Command::Status(args) => status::run(ctx, args),
        Command::Probe(Nested { command: cmd }) => probe::run(ctx, cmd, wasm),
        Command::Doctor(args) => doctor::run(ctx, args),
        Command::Backup(args) => backup::run(ctx, args),
        Command::Gc(args) => gc::run(ctx, args),
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(ctx, args),
        Command::InspectRegistry(args) => inspect_registry::run(ctx, args),
        Command::Serve(args) => serve::run(ctx, args),
        Command::Turn(_)
        | Command::Loop(_)
        | Command::Extension(_)
        | Command::Capability(_)
        | Command::Provider(_) => wasm(ctx, command),
    }
}

/// Runs a WebAssembly command in this process (the `loopx-wasm` binary).
pub fn run_wasm_command(ctx: &Context, command: Command) -> Result<Output> {
    match command {
        Command::Turn(Nested { command: cmd }) => {
            crate::turn::channel::install_handler(agent_channel::serve);
            turn::run(ctx, cmd)
        }
        Command::Loop(args) => {
            crate::turn::channel::install_handler(agent_channel::serve);
            loop_cmd::run(ctx, args)
        }
        Command::Extension(Nested { command: cmd }) => extension::run(ctx, cmd),
        Command::Capability(Nested { command: cmd }) => capability::run(ctx, cmd),
        Command::Provider(Nested { command: cmd }) => provider::run(ctx, cmd),
        Command::Probe(Nested {
            command: probe::ProbeCommand::Run { goal_id },
        }) => probe::run_now(ctx, &goal_id),
        other => dispatch(ctx, other, run_wasm_command),
    }
}

/// Replaces this process with `loopx-wasm` from the same directory, same arguments and
/// environment (the `loopx` binary). Same process id, so signals, process groups and the turn
/// driver's parent-death handling are unaffected. Returns only when the exec fails.
pub fn exec_wasm_host(_ctx: &Context, _command: Command) -> Result<Output> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()
        .map_err(|e| LoopxError::internal("locating the loopx binary", e))?;
    let host = exe.with_file_name(WASM_HOST_BINARY);
    let err = std::process::Command::new(&host)
        .args(std::env::args_os().skip(1))
        .exec();
    Err(crate::error::not_found(format!(
        "cannot run {} ({err}): the WebAssembly commands (turn, loop, extension, capability, \
         provider) run in `{WASM_HOST_BINARY}`, which is installed beside `loopx`; reinstall with \
         `cargo install --path .` or build with `cargo build --release`",
        host.display()
    )))
}

/// Runs the CLI with the process arguments and returns the exit code, which the caller, a
/// binary's `main`, exits with at once (the store is left for the exit to release:
/// [`Context::release_at_exit`]).
pub fn main(wasm: WasmDispatch) -> i32 {
    if let Some(code) = agent_channel::forward_if_inside_turn() {
        return code;
    }
    let started = std::time::Instant::now();
    let cli = match parse::parse_args() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => return argument_error(&e, std::env::args_os()),
        Err(e) => {
            // `--help` and `--version`: clap's own text, unchanged by `--format`, styled as clap
            // styles it (bold and underlined headings, only on a terminal, and not when NO_COLOR
            // is set to anything but the empty string, as no-color.org asks), and written like
            // any output: a stdout that refuses it is exit 6, as for every command.
            use std::io::IsTerminal;
            let styled = std::io::stdout().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            let text = if styled {
                e.render().ansi().to_string()
            } else {
                e.render().to_string()
            };
            return match write_stdout(&text) {
                Ok(()) => 0,
                Err(err) => {
                    report_error(&err, Format::Text);
                    err.exit_code()
                }
            };
        }
    };
    let verbosity = cli.verbosity();
    let mut format = cli.format();
    if let Command::ProjectPrompt(Nested {
        command: project_prompt::ProjectPromptCommand::List { json: true },
    }) = &cli.command
    {
        format = Format::Json;
    }
    let ctx = match Context::from_env(cli.root, verbosity, format) {
        Ok(ctx) => ctx,
        Err(err) => {
            report_error(&err, format);
            return err.exit_code();
        }
    };
    let code = match dispatch(&ctx, cli.command, wasm) {
        Ok(mut output) => {
            // Failures after the command committed (a projection the disk refused): the
            // command succeeded, and says what is left to repair.
            let warnings = ctx.take_warnings();
            if let (false, Some(value)) = (warnings.is_empty(), output.value.as_object_mut()) {
                value.insert("warnings".to_string(), serde_json::json!(warnings));
            }
            let written = write_stdout(&output.render(format));
            let exit_code = output.exit_code;
            for warning in &warnings {
                use std::io::Write;
                let line = format!("loopx: warning: {}\n", crate::inert::text(warning));
                let _ = std::io::stderr().write_all(line.as_bytes());
            }
            match written {
                Ok(()) => exit_code,
                // The change is made: an error code would have a retrying caller make it twice
                // (docs/cli.md, "Exit codes").
                Err(err) if ctx.has_committed() => {
                    use std::io::Write;
                    let line = format!(
                        "loopx: warning: the command committed, but its output could not be \
                         written: {}\n",
                        crate::inert::text(&err.to_string())
                    );
                    let _ = std::io::stderr().write_all(line.as_bytes());
                    exit_code
                }
                Err(err) => {
                    report_error(&err, Format::Text);
                    err.exit_code()
                }
            }
        }
        Err(err) => {
            report_error(&err, format);
            err.exit_code()
        }
    };
    if ctx.verbosity == Verbosity::Verbose {
        if let Some(paths) = ctx.kernel.get().and(ctx.paths().ok()) {
            ctx.detail(&format!("project {}", paths.project.display()));
        }
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        ctx.detail(&format!("exit {code} after {ms:.1} ms"));
    }
    ctx.release_at_exit();
    code
}

/// Reports an argument error (unknown flag, missing value, bad enum value) with exit 2, the
/// code of bad input. With `--format json` anywhere on the command line it is the JSON error
/// envelope every other error prints; otherwise clap's text. Either way the text is made inert,
/// as clap echoes the offending argument as typed.
fn argument_error(e: &clap::Error, args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let (stdout, stderr) = argument_error_text(e, args);
    if let Some(text) = stdout {
        let _ = write_stdout(&text);
    }
    use std::io::Write;
    let _ = std::io::stderr().write_all(stderr.as_bytes());
    2
}

/// What an argument error prints: the JSON envelope for stdout when JSON was asked for, and the
/// text for stderr (clap's whole text otherwise).
fn argument_error_text(
    e: &clap::Error,
    args: impl IntoIterator<Item = std::ffi::OsString>,
) -> (Option<String>, String) {
    let args: Vec<std::ffi::OsString> = args.into_iter().collect();
    let not_utf8 = (e.kind() == clap::error::ErrorKind::InvalidUtf8)
        .then(|| not_utf8_message(&args))
        .flatten();
    let text = match &not_utf8 {
        Some(message) => format!("error: {message}\n"),
        None => flags::render_value_error(e)
            .or_else(|| {
                flags::unknown_word_message(e)
                    .map(|m| format!("error: {m}\n\nFor more information, try '--help'.\n"))
            })
            .unwrap_or_else(|| e.render().to_string()),
    };
    if json_requested(args) {
        let message = match flags::value_error_parts(e) {
            _ if let Some(message) = not_utf8 => message,
            _ if let Some(message) = flags::unknown_word_message(e) => message,
            Some((flag, Some(value), reason)) => format!("{flag} '{value}' {reason}"),
            _ if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                missing_command_message(&text)
            }
            _ => argument_error_message(&text),
        };
        error_text(&crate::error::bad_input(message), Format::Json)
    } else {
        (None, crate::inert::text(&text).into_owned())
    }
}

/// What clap reports only as "invalid UTF-8 was detected in one or more arguments", naming the
/// argument (its position and value, the undecodable bytes shown as U+FFFD) or `LOOPX_ROOT`,
/// the one variable clap reads. `None` when neither is the cause.
fn not_utf8_message(args: &[std::ffi::OsString]) -> Option<String> {
    if let Some((position, arg)) = args
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, a)| a.to_str().is_none())
    {
        return Some(format!(
            "argument {position}{} is not valid UTF-8; loopx takes UTF-8 arguments only",
            crate::error::quoted_input(&arg.to_string_lossy(), 32)
        ));
    }
    std::env::var_os("LOOPX_ROOT")
        .is_some_and(|v| v.to_str().is_none())
        .then(|| {
            "the environment variable LOOPX_ROOT is not valid UTF-8; set it to a UTF-8 project \
             directory or unset it"
                .to_string()
        })
}

/// Whether the command line asks for `--format json` (`--format json` or `--format=json`), read
/// from the raw arguments because parsing them is what failed. Arguments after `--` belong to a
/// host's argv and do not count.
fn json_requested(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    let mut previous_was_format = false;
    for arg in args.into_iter().skip(1) {
        let Some(arg) = arg.to_str() else {
            previous_was_format = false;
            continue;
        };
        if arg == "--" {
            return false;
        }
        if (previous_was_format && arg == "json") || arg == "--format=json" {
            return true;
        }
        previous_was_format = arg == "--format";
    }
    false
}

/// A group run without its command (`loopx todo`), for which clap prints the group's help: the
/// message names the commands it has and the usage line, not the whole page.
fn missing_command_message(help: &str) -> String {
    let usage = help
        .lines()
        .find_map(|l| l.strip_prefix("Usage: "))
        .unwrap_or("loopx <COMMAND>");
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .collect();
    format!(
        "a command is required: {}; usage: {usage}",
        commands.join(", ")
    )
}

/// clap's rendered error as one message: the error line without its `error: ` prefix, then its
/// tips and the usage line, joined with `; ` (the pointer to `--help` left out).
fn argument_error_message(rendered: &str) -> String {
    rendered
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("For more information"))
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .map(|l| match l.strip_prefix("Usage: ") {
            Some(usage) => format!("usage: {usage}"),
            None => l.to_string(),
        })
        .fold(String::new(), |mut message, line| {
            // A line that announces a list ("...were not provided:") runs on into it.
            if !message.is_empty() {
                message.push_str(if message.ends_with(':') { " " } else { "; " });
            }
            message.push_str(&line);
            message
        })
}

/// Writes a command's output. A reader that went away (`loopx ... | head -1`) is not an error:
/// the command's work is done and whoever read the output has what they wanted.
fn write_stdout(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(LoopxError::internal("writing the output", e))
        }
        _ => Ok(()),
    }
}

/// Prints `err` as every `loopx` command does: the JSON envelope on stdout under `--format json`,
/// and a line on stderr (also used by `loopx-serve` for its start-up failures).
pub fn report_error(err: &LoopxError, format: Format) {
    let (stdout, stderr) = error_text(err, format);
    if let Some(text) = stdout {
        // Nothing more can be reported if stdout is gone too; stderr below still says it.
        let _ = write_stdout(&text);
    }
    use std::io::Write;
    let _ = std::io::stderr().write_all(stderr.as_bytes());
}

/// How an error is reported: the JSON envelope for stdout (with `--format json`) and the line
/// for stderr.
fn error_text(err: &LoopxError, format: Format) -> (Option<String>, String) {
    let mut message = match err {
        LoopxError::Corrupt { path, detail } => format!(
            "corrupt state at {}: {}",
            path.display(),
            next_action::message_text(detail)
        ),
        _ => match err.message() {
            Some(m) => next_action::message_text(m),
            None => err.to_string(),
        },
    };
    if let LoopxError::Internal { source, .. } = err {
        for cause in source.chain().skip(1) {
            message.push_str(&format!(": {cause}"));
        }
    }
    let stdout = (format == Format::Json).then(|| {
        let mut error =
            serde_json::json!({"kind": err.kind(), "exit_code": err.exit_code(), "message": message});
        // A sandbox failure says which limit or fault stopped the plugin as a field, so a
        // script branches on it without reading the message.
        if let Some(plugin) = err
            .cause()
            .and_then(|c| c.downcast_ref::<crate::plugin::error::PluginError>())
        {
            error["plugin_failure"] = serde_json::json!(plugin.kind());
        }
        let value = serde_json::json!({
            "schema_version": output::CLI_SCHEMA,
            "ok": false,
            "error": error,
        });
        let mut text = serde_json::to_string_pretty(&value).expect("error values serialize");
        text.push('\n');
        text
    });
    // Messages echo input (ids, paths, values) and carry guest error text: shown inert.
    (
        stdout,
        format!("loopx: error: {}\n", crate::inert::text(&message)),
    )
}

/// Formats an optional value for text output.
pub(crate) fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|v| v.to_string())
        .unwrap_or_else(|| "-".to_string())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// Clap checks a command's definition only when it builds it, and with `defer` a short
    /// process builds just the command it runs; this builds and checks every one.
    #[test]
    fn every_command_definition_is_valid() {
        Cli::command().debug_assert();
    }

    /// Every value the command line takes must be text: LoopX echoes values into JSON, Markdown
    /// and messages, and a path that is not UTF-8 cannot be written there (it panicked in `json!`
    /// before path arguments went through `flags::path`). clap's own path and OS-string parsers
    /// are the ones that take any bytes.
    #[test]
    fn every_argument_refuses_bytes_that_are_not_utf8() {
        fn takes_any_bytes(arg: &clap::Arg) -> bool {
            let parser = format!("{:?}", arg.get_value_parser());
            arg.get_action().takes_values()
                && (parser == "ValueParser::path_buf" || parser == "ValueParser::os_string")
        }
        fn walk(cmd: &mut clap::Command, path: &str, bad: &mut Vec<String>) {
            cmd.build();
            let here = format!("{path} {}", cmd.get_name());
            for arg in cmd.get_arguments().filter(|a| takes_any_bytes(a)) {
                bad.push(format!("{here}: {}", arg.get_id()));
            }
            for sub in cmd.get_subcommands_mut() {
                walk(sub, &here, bad);
            }
        }
        let plain = clap::Arg::new("p").value_parser(clap::value_parser!(std::path::PathBuf));
        assert!(takes_any_bytes(&plain), "the check sees clap's path parser");
        let mut bad = Vec::new();
        walk(&mut Cli::command(), "", &mut bad);
        assert!(
            bad.is_empty(),
            "arguments taking bytes that are not UTF-8: {bad:#?}"
        );
    }

    /// clap makes a flattened argument struct's doc comment the description of the command that
    /// flattens it, so the structs several commands share carry plain comments only.
    #[test]
    fn shared_argument_structs_describe_no_command() {
        use clap::Args;
        for (name, cmd) in [
            (
                "AgentProof",
                todo::AgentProof::augment_args(clap::Command::new("c")),
            ),
            (
                "ScheduleArgs",
                todo::ScheduleArgs::augment_args(clap::Command::new("c")),
            ),
            (
                "TurnArgs",
                turn::TurnArgs::augment_args(clap::Command::new("c")),
            ),
        ] {
            assert_eq!(cmd.get_about(), None, "{name} has a doc comment");
            assert_eq!(cmd.get_long_about(), None, "{name} has a doc comment");
        }
    }

    #[test]
    fn a_command_group_parses_into_its_command() {
        let cli = Cli::try_parse_from(["loopx", "quota", "should-run", "--goal-id", "g"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Quota(Nested {
                command: quota::QuotaCommand::ShouldRun { .. }
            })
        ));
        let err = Cli::try_parse_from(["loopx", "todo"]).unwrap_err();
        assert_eq!(
            err.exit_code(),
            2,
            "a group without a command is a usage error"
        );
    }
}
