//! `loopx backup`: a consistent copy through SQLite's online backup API, checked, synced and
//! linked into place without ever replacing a file.

use super::*;

impl SqliteStore {
    /// A consistent copy of the database at `dest` through SQLite's online backup API, which
    /// reads every page in one read transaction (WAL content included) while writers go on. The
    /// copy is written to a temporary file beside `dest`, checked with `PRAGMA integrity_check`,
    /// synced, and only then linked into place, so `dest` never holds a partial copy; an existing
    /// `dest` is never replaced.
    pub(super) fn backup_to(&self, dest: &Path) -> Result<u64> {
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // A killed backup's copy sits beside the destination, out of `gc`'s reach.
        crate::state_file::remove_stale_temps(dest);
        let tmp = crate::state_file::temp_path(dest);
        let _ = std::fs::remove_file(&tmp);
        let result = self.backup_into(&tmp).and_then(|pages| {
            // Never over an existing file, even one created after the caller looked.
            link_no_replace(&tmp, dest).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    crate::error::conflict(format!(
                        "{} already exists; a backup never replaces a file: choose a new path",
                        dest.display()
                    ))
                } else {
                    LoopxError::io(dest, format!("linking the backup to {}", dest.display()), e)
                }
            })?;
            sync_directory(&dir)?;
            Ok(pages)
        });
        let _ = std::fs::remove_file(&tmp);
        result
    }

    /// Copies every page into a new database file at `tmp`, checks it, and syncs it.
    pub(super) fn backup_into(&self, tmp: &Path) -> Result<u64> {
        use rusqlite::backup::{Backup, StepResult};
        let mut copy = Connection::open_with_flags(
            tmp,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|e| map_err(tmp, "creating the backup file", e))?;
        // The copy is one self-contained file: its pages are written straight into it (rollback
        // journal, deleted at the end), not into a WAL beside it that could be lost.
        copy.pragma_update(None, "journal_mode", "DELETE")
            .map_err(|e| map_err(tmp, "preparing the backup file", e))?;
        let pages = {
            let backup = Backup::new(&self.conn, &mut copy)
                .map_err(|e| map_err(&self.path, "starting the backup", e))?;
            // All pages in one step: one read transaction, so the copy is one consistent
            // snapshot, and a concurrent writer does not restart the copy.
            loop {
                match backup
                    .step(-1)
                    .map_err(|e| map_err(&self.path, "copying pages", e))?
                {
                    StepResult::Done => break,
                    StepResult::More => continue,
                    StepResult::Busy | StepResult::Locked => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => continue,
                }
            }
            backup.progress().pagecount
        };
        // The pages were copied as they are, so damage in the copy is damage in the source: it is
        // reported against the project's database, and marks it like any damage SQLite reports.
        let problems: Vec<String> =
            match copy.prepare("PRAGMA integrity_check").and_then(|mut s| {
                s.query_map([], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<String>>>()
            }) {
                Ok(rows) => rows.into_iter().filter(|r| r != "ok").collect(),
                Err(rusqlite::Error::SqliteFailure(f, message))
                    if matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
                {
                    vec![message.unwrap_or_else(|| f.to_string())]
                }
                Err(e) => return Err(map_err(tmp, "checking the backup", e)),
            };
        if !problems.is_empty() {
            let detail = msg![
                format!(
                    "the backup copy fails PRAGMA integrity_check ({}), so this database is \
                     damaged; no backup was written. Run ",
                    problems.join("; ")
                ),
                NextAction::CheckProject,
                ", and restore from an earlier backup"
            ];
            mark_damaged(&self.path, &detail.to_string());
            return Err(LoopxError::Corrupt {
                path: self.path.clone(),
                detail,
            });
        }
        // A restored copy must run as the project's database does, in WAL mode (readers beside
        // the writer). Switching writes the mode into the file's header; closing the last
        // connection then checkpoints and deletes the new WAL, so the copy stays one file.
        copy.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| map_err(tmp, "finishing the backup file", e))?;
        copy.close()
            .map_err(|(_, e)| map_err(tmp, "closing the backup file", e))?;
        let mut copy_wal = tmp.as_os_str().to_owned();
        copy_wal.push("-wal");
        if std::path::Path::new(&copy_wal).exists() {
            return Err(LoopxError::internal(
                "finishing the backup file",
                anyhow::anyhow!(
                    "SQLite left {} behind after closing the copy",
                    tmp.display()
                ),
            ));
        }
        std::fs::File::open(tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| LoopxError::io(tmp, format!("syncing {}", tmp.display()), e))?;
        Ok(u64::try_from(pages).unwrap_or(0))
    }
}

/// Gives the finished file `tmp` the name `dest`, failing with `AlreadyExists` if `dest` exists.
/// A hard link refuses an existing name atomically; filesystems without hard links (FAT on a USB
/// drive, some network mounts) get `renameat2(RENAME_NOREPLACE)`, which refuses it atomically too.
/// Only where neither exists is the name checked and then taken, with a window between the two.
pub(super) fn link_no_replace(tmp: &Path, dest: &Path) -> std::io::Result<()> {
    let linked = std::fs::hard_link(tmp, dest);
    match &linked {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return linked,
        Err(_) => {}
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::ffi::OsStrExt;
        let from = std::ffi::CString::new(tmp.as_os_str().as_bytes())?;
        let to = std::ffi::CString::new(dest.as_os_str().as_bytes())?;
        // SAFETY: both paths are NUL-terminated strings that outlive the call; `AT_FDCWD`
        // resolves relative paths as `rename` would.
        let rc = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::RENAME_NOREPLACE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(err);
        }
    }
    if dest.symlink_metadata().is_ok() {
        return Err(std::io::Error::from(std::io::ErrorKind::AlreadyExists));
    }
    std::fs::rename(tmp, dest)
}
