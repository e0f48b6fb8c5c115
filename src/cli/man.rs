//! `loopx man`: the manual page in roff, generated from the parser's own definition (the top
//! page on stdout, or one page per command with `--out DIR`), so the page and the binary agree.

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::{LoopxError, Result};

#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// Write one page per command into DIR (loopx.1, loopx-todo.1, loopx-todo-add.1, ...), created
    /// if absent; existing pages of the same names are replaced. Without it the top page goes to
    /// stdout.
    #[arg(long, value_name = "DIR", value_parser = super::flags::path)]
    pub out: Option<PathBuf>,
}

/// The whole command tree, built: groups are deferred, and a page lists its subcommands.
fn command_tree() -> clap::Command {
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn render(cmd: &clap::Command) -> String {
    let mut roff = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut roff)
        .expect("rendering into memory does not fail");
    String::from_utf8(roff).expect("clap_mangen writes UTF-8")
}

pub fn run(ctx: &Context, args: ManArgs) -> Result<Output> {
    let cmd = command_tree();
    let Some(out) = args.out else {
        let page = render(&cmd);
        return Ok(Output::new(json!({"page": "loopx.1", "roff": page})).verbatim(page));
    };
    let dir = ctx.absolute(&out)?;
    std::fs::create_dir_all(&dir)
        .map_err(|e| LoopxError::io(&dir, format!("creating {}", dir.display()), e))?;
    let mut written = Vec::new();
    write_pages(&cmd, &dir, &mut written)?;
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    Ok(Output::new(json!({"dir": dir, "pages": names}))
        .heading(format!("Wrote {} manual pages", written.len()))
        .fields([("directory", dir.display().to_string())])
        .list(names))
}

fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, render(cmd))
        .map_err(|e| LoopxError::io(&path, format!("writing {}", path.display()), e))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_pages(sub, dir, written)?;
    }
    Ok(())
}
