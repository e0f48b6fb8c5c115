//! `loopx backup PATH`: a consistent copy of the project's database in one new file.
//!
//! The database's committed state lives in two files, `loopx.db` and `loopx.db-wal`: copying
//! `loopx.db` alone copies what was last checkpointed, not what was committed. This command reads
//! every page through SQLite's online backup API, in one read transaction beside any writer, and
//! writes a single self-contained file that `PRAGMA integrity_check` has passed.

use std::path::PathBuf;

use serde_json::json;

use super::Context;
use super::output::Output;
use crate::error::{Result, conflict};
use crate::kernel::doctor::backup_database;

#[derive(Debug, clap::Args)]
pub struct BackupArgs {
    /// The file to write: it must not exist (a backup never replaces a file).
    #[arg(value_parser = super::flags::path)]
    pub path: PathBuf,
}

pub fn run(ctx: &Context, args: BackupArgs) -> Result<Output> {
    let paths = ctx.paths()?;
    let dest = ctx.absolute(&args.path)?;
    // Checked here for a clear message; `backup_to` links the finished copy with a call that
    // also refuses an existing file, so a file created meanwhile is never replaced either.
    if dest.symlink_metadata().is_ok() {
        return Err(conflict(format!(
            "{} already exists; a backup never replaces a file: choose a new path",
            dest.display()
        )));
    }
    let pages = backup_database(&paths, &dest)?;
    let bytes = std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
    Ok(Output::new(json!({
        "backup": dest,
        "database": paths.db(),
        "pages": pages,
        "bytes": bytes,
        "integrity_check": "ok",
    }))
    .heading(format!("Backed up {}", paths.db().display()))
    .fields([
        ("copy", dest.display().to_string()),
        ("size", format!("{bytes} bytes, {pages} pages")),
        ("integrity_check", "ok".to_string()),
        (
            "restore",
            "with nothing running: move .loopx/loopx.db, loopx.db-wal and loopx.db-shm aside, \
             copy this file to .loopx/loopx.db"
                .to_string(),
        ),
    ]))
}
