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
    /// if absent; existing pages of the same names are replaced (the directory entry, never what
    /// a link there points to). Without it the top page goes to stdout.
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
    let mut pages = Vec::new();
    collect_pages(&cmd, &dir, &mut pages);
    // Every name is checked before any page is written, so a refusal leaves the directory as it
    // was.
    for (path, _) in &pages {
        if let Ok(meta) = std::fs::symlink_metadata(path)
            && meta.is_dir()
        {
            return Err(LoopxError::io(
                path,
                format!(
                    "{} is a directory, where a manual page would go; move it or choose another \
                     --out",
                    path.display()
                ),
                std::io::Error::from(std::io::ErrorKind::IsADirectory),
            ));
        }
    }
    let mut written = Vec::new();
    for (path, page) in pages {
        replace_file(&path, page.as_bytes())?;
        written.push(path);
    }
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    Ok(Output::new(json!({"dir": dir, "pages": names}))
        .heading(format!("Wrote {} manual pages", written.len()))
        .fields([("directory", dir.display().to_string())])
        .list(names))
}

/// Each visible command's page path in `dir` and its text, the command first.
fn collect_pages(cmd: &clap::Command, dir: &Path, pages: &mut Vec<(PathBuf, String)>) {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    pages.push((dir.join(format!("{name}.1")), render(cmd)));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect_pages(sub, dir, pages);
    }
}

/// Puts `bytes` at `path` through a new file renamed over it: a link, a FIFO or a device left at
/// `path` is replaced as a name, never written through or waited on.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let fail = |e: std::io::Error| LoopxError::io(path, format!("writing {}", path.display()), e);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&temp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(fail(e));
    }
    Ok(())
}
