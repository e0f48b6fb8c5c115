//! `loopx completions SHELL`: the shell's completion script, generated from the very definition
//! the parser uses, so completions never name a command or flag the binary does not have.

use clap::CommandFactory;
use serde_json::json;

use super::output::Output;
use crate::error::Result;

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for: bash, zsh, fish, powershell or elvish.
    #[arg(value_enum, value_name = "SHELL")]
    pub shell: clap_complete::Shell,
}

pub fn run(args: CompletionsArgs) -> Result<Output> {
    let mut cmd = super::Cli::command();
    let mut script = Vec::new();
    // `generate` builds the whole tree (every deferred group included) before writing.
    clap_complete::generate(args.shell, &mut cmd, super::BIN_NAME, &mut script);
    let script = String::from_utf8(script).expect("clap writes completions as UTF-8");
    Ok(Output::new(json!({"shell": args.shell.to_string(), "script": script})).verbatim(script))
}
