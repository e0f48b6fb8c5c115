//! The damage marker (`.loopx/CORRUPT`): once SQLite reports a damaged page, writes refuse
//! with one `stat` until `doctor` finds the database healthy again.

use super::*;

/// The file whose existence tells every write that SQLite found a damaged page in this
/// project's database: `.loopx/CORRUPT` beside `loopx.db`. A file, not a row, because the write
/// path checks it with one `stat` before taking the write lock, and a damaged database may not
/// be able to hold a row.
pub const DAMAGE_MARKER: &str = "CORRUPT";

/// The damage marker of the database at `db`.
pub fn damage_marker(db: &Path) -> PathBuf {
    db.with_file_name(DAMAGE_MARKER)
}

/// Records that the database at `db` is damaged. Best effort: on a read-only or full disk the
/// command still fails with exit 5; only the later writes lose the early refusal (and SQLite
/// then reports the damage again on the pages they touch).
pub fn mark_damaged(db: &Path, detail: &str) {
    // Only a project's own database (`.loopx/loopx.db`): a damaged file met elsewhere, such as a
    // backup being written, must not leave a marker in a directory that is not a project.
    let is_project_db = db.file_name() == Some(std::ffi::OsStr::new(crate::paths::DB_FILE))
        && db.parent().and_then(Path::file_name)
            == Some(std::ffi::OsStr::new(crate::paths::STATE_DIR));
    if !is_project_db {
        return;
    }
    let marker = damage_marker(db);
    if marker.exists() {
        return;
    }
    let text = format!(
        "SQLite reported damage in {} at {} ms since the epoch:\n{detail}\n\
         Writes refuse while this file exists. Restore the database from a backup, then run \
         the doctor command, which removes this file once the database checks healthy.\n",
        db.display(),
        crate::clock::now_ms()
    );
    // Created, never opened through a link planted at the name (`exists` follows links, so
    // only a dangling one gets here).
    let _ = std::fs::File::options()
        .write(true)
        .create_new(true)
        .open(&marker)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
}

/// Refuses a write when the damage marker exists: one `stat` (docs/decisions.md, "Writes stop
/// at the first sign of a damaged database").
pub(super) fn refuse_if_damaged(db: &Path) -> Result<()> {
    let marker = damage_marker(db);
    match std::fs::symlink_metadata(&marker) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        _ => Err(LoopxError::Corrupt {
            path: db.to_path_buf(),
            detail: msg![
                format!(
                    "writes are refused: damage was found in this database ({} exists; it says \
                     what and when). Restore the database from a backup (",
                    marker.display()
                ),
                NextAction::BackUp,
                " makes one), then run ",
                NextAction::CheckProject,
                ", which removes the marker once the database checks healthy"
            ],
        }),
    }
}
