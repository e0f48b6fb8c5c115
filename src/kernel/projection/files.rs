//! Writing projection files so that no reader ever sees half of one, and no file someone edited
//! by hand is silently replaced: atomic replacement through the projection's spare
//! (`spare.rs`) or a temp file, write-once run reports, and the write stamps that let a JSON
//! projection LoopX wrote itself be trusted from one `stat`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[cfg(target_os = "linux")]
use super::place::rename_noreplace;
use super::place::{Old, create_temp, replace};
#[cfg(target_os = "linux")]
use super::spare::Spare;
use crate::error::{LoopxError, NextAction, Result, msg};

/// Fails with exit 5 when `path` exists, is not empty, and is not valid JSON.
pub fn check_json_projection(path: &Path) -> Result<()> {
    use crate::state_file::{MAX_PROJECTION_BYTES, read_bounded};
    match read_bounded(path, MAX_PROJECTION_BYTES) {
        Ok(bytes) if bytes.is_empty() => Ok(()),
        Ok(bytes) => serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).map(|_| ()).map_err(|e| LoopxError::Corrupt {
            path: path.to_path_buf(),
            detail: msg![
                format!("projection does not parse ({e}); it was left untouched. Move it aside and run "),
                NextAction::Reproject,
                " to re-create it from the database"
            ],
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidInput | std::io::ErrorKind::FileTooLarge
            ) =>
        {
            Err(LoopxError::Corrupt {
                path: path.to_path_buf(),
                detail: msg![
                    format!("{e}, so it is no projection LoopX wrote; it was left untouched. Move it aside and run "),
                    NextAction::Reproject,
                    " to re-create it from the database"
                ],
            })
        }
        Err(e) => Err(LoopxError::internal(format!("reading {}", path.display()), e)),
    }
}

/// The check before a JSON projection is replaced: like [`check_json_projection`], but a file
/// that still matches the stamp of LoopX's own last write is accepted from one `stat`.
pub(crate) fn check_before_overwrite(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        // A FIFO or a device also has length 0: only a regular file is an empty projection.
        Ok(meta) if meta.is_file() && meta.len() == 0 => Ok(()),
        Ok(meta) if meta.is_file() && stamp_matches(read_stamp(path).as_deref(), &meta) => Ok(()),
        _ => check_json_projection(path),
    }
}

pub(super) fn stamp_path(path: &Path) -> PathBuf {
    crate::state_file::companion_path(path, "stamp")
}

/// Length, modification time and inode, each zero-padded to a fixed width (see [`write_stamp`]).
pub(super) fn stamp_of(meta: &std::fs::Metadata) -> String {
    format!(
        "{:020} {:020}.{:09} {:020}",
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ino()
    )
}

pub(super) fn read_stamp(path: &Path) -> Option<String> {
    crate::state_file::read_bounded_text(&stamp_path(path), crate::state_file::MAX_RECORD_BYTES)
        .ok()
}

/// Whether a stamp's first line (the projection's own stat; a goal's state stamp has a second)
/// is the stat `meta`.
pub(super) fn stamp_matches(stamp: Option<&str>, meta: &std::fs::Metadata) -> bool {
    stamp.and_then(|s| s.lines().next()) == Some(stamp_of(meta).as_str())
}

/// Writes a JSON projection after checking the file it replaces, and stamps the result.
pub(super) fn write_json_projection(
    path: &Path,
    fill: impl FnOnce(&mut ProjectionWriter) -> std::io::Result<()>,
) -> Result<()> {
    let meta = replace_json_projection(path, fill)?;
    write_stamp(&stamp_path(path), stamp_of(&meta).as_bytes())
}

/// Replaces a JSON projection after checking the file it replaces, and returns the stat of the
/// new file for its stamp (which the caller writes).
pub(super) fn replace_json_projection(
    path: &Path,
    fill: impl FnOnce(&mut ProjectionWriter) -> std::io::Result<()>,
) -> Result<std::fs::Metadata> {
    check_before_overwrite(path)?;
    write_atomic_with(path, fill)
}

/// Overwrites the stamp file in place. A stamp left stale by a crash between the rename and this
/// write cannot match the new projection: it names the old inode, which was still alive when the
/// new file's inode was allocated. A torn stamp matches nothing. So the stamp is neither replaced
/// by a new file (every file created costs an inode allocation, which on ext4 without a journal
/// scans past every recently deleted inode) nor truncated: truncating a file to zero makes ext4
/// start writing it back on close (`auto_da_alloc`), and the next truncation waits for that write
/// (docs/benchmarks.md). Stamps have a fixed width, so the new one covers the old.
pub(super) fn write_stamp(stamp_file: &Path, stamp: &[u8]) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let stamp_err = |e| LoopxError::internal(format!("writing {}", stamp_file.display()), e);
    // A stamp is LoopX's own and safe to delete: whatever else has its name is replaced.
    let file = match crate::state_file::open_own_file(stamp_file) {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            std::fs::remove_file(stamp_file).map_err(stamp_err)?;
            crate::state_file::open_own_file(stamp_file)
        }
        opened => opened,
    }
    .map_err(stamp_err)?;
    file.write_all_at(stamp, 0).map_err(stamp_err)?;
    // Only a stamp longer than ours (damaged, or written by hand) needs cutting.
    if file.metadata().map_err(stamp_err)?.len() > stamp.len() as u64 {
        file.set_len(stamp.len() as u64).map_err(stamp_err)?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (see [`with_temp_file`]), straight from the slice.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_stat(path, bytes).map(drop)
}

/// [`write_atomic`], returning the stat of the file written: taken from that file (the spare or
/// a temp file) before it is put in place, which keeps its inode and modification time, so it is
/// this write's even when another process replaces `path` right after.
pub(super) fn write_atomic_stat(path: &Path, bytes: &[u8]) -> Result<std::fs::Metadata> {
    with_temp_file(path, |mut file| {
        file.write_all(bytes)?;
        Ok(file)
    })
}

/// The buffered file (the spare or a temp file) a projection is streamed into; a concrete type,
/// so serde's many small writes inline into buffer copies.
pub(super) type ProjectionWriter = BufWriter<File>;

/// Writes `path` atomically, `fill` streaming the content through a 64 KiB buffer; returns the
/// stat of the file written, as [`write_atomic_stat`] does.
pub(super) fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut ProjectionWriter) -> std::io::Result<()>,
) -> Result<std::fs::Metadata> {
    with_temp_file(path, |file| {
        let mut w = BufWriter::with_capacity(64 << 10, file);
        fill(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())
    })
}

/// Writes `path` through a file beside it (its spare, or a temp file) that is then put in its
/// place, so a reader sees the old content or the new, never part of it. Returns the written
/// file's stat.
pub(super) fn with_temp_file(
    path: &Path,
    write: impl FnOnce(File) -> std::io::Result<File>,
) -> Result<std::fs::Metadata> {
    with_temp_file_unless_declined(path, |file| write(file).map(Some))?.ok_or_else(|| {
        LoopxError::internal(
            format!("writing {}", path.display()),
            std::io::Error::other("the write was declined"),
        )
    })
}

/// [`with_temp_file`], except that `write` may decline (`Ok(None)`) once it has seen what it
/// builds on: `path` is then left as it is, and the result is `None`. The content is written into
/// the projection's spare when it can be (`Spare`), otherwise into a new temp file.
pub(super) fn with_temp_file_unless_declined(
    path: &Path,
    write: impl FnOnce(File) -> std::io::Result<Option<File>>,
) -> Result<Option<std::fs::Metadata>> {
    // A spare opens only in an existing directory; the temp route makes a missing one.
    #[cfg(target_os = "linux")]
    if let Some(spare) = Spare::lease(path) {
        return spare
            .write_into(path, write)
            .map_err(|e| LoopxError::internal(format!("writing {}", path.display()), e));
    }
    make_parent_dir(path)?;
    write_through_temp(path, write)
}

/// Writes `path` through a new temp file beside it, which is then put in its place.
fn write_through_temp(
    path: &Path,
    write: impl FnOnce(File) -> std::io::Result<Option<File>>,
) -> Result<Option<std::fs::Metadata>> {
    let failed = |e| LoopxError::internal(format!("writing {}", path.display()), e);
    let (tmp, file) = create_temp(path).map_err(failed)?;
    let result = (|| -> std::io::Result<Option<std::fs::Metadata>> {
        let Some(file) = write(file)? else {
            std::fs::remove_file(&tmp)?;
            return Ok(None);
        };
        let meta = file.metadata()?;
        drop(file);
        replace(&tmp, path, Old::Remove)?;
        Ok(Some(meta))
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        failed(e)
    })
}

/// Makes the directory a projection is written in, if missing.
fn make_parent_dir(path: &Path) -> Result<()> {
    let dir = path.parent().expect("projection paths have a parent");
    std::fs::create_dir_all(dir)
        .map_err(|e| LoopxError::internal(format!("creating {}", dir.display()), e))
}

/// Writes a file that must never change once written (run reports): refuses to replace a
/// non-empty one, and goes through a temp file so a reader never sees half a report.
pub(super) fn write_once(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut pending = PendingFile::create(path)?;
    pending.write(bytes)?;
    pending.commit_once()
}

/// Puts the temp file of a write-once file in place, unless a file with other content is there
/// (a conflict). The same content already in place is success: two processes that render one
/// record (a run's report, written by the command that recorded the run and by a concurrent
/// re-creation of missing reports) write the same bytes, and neither has anything to report.
/// On Linux the rename itself refuses to replace anything (`RENAME_NOREPLACE`), so a file another
/// process put there between a check and the rename is never replaced; only an empty one, which
/// is what a power cut leaves of a file renamed into place, is.
fn put_once(tmp: &Path, path: &Path) -> Result<()> {
    let failed = |e| LoopxError::internal(format!("writing {}", path.display()), e);
    #[cfg(target_os = "linux")]
    match rename_noreplace(tmp, path) {
        Ok(()) => return Ok(()),
        Err(e) => match e.raw_os_error() {
            Some(libc::EEXIST | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {}
            _ => return Err(failed(e)),
        },
    }
    if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        if same_content(tmp, path) {
            return std::fs::remove_file(tmp).map_err(failed);
        }
        return Err(crate::error::conflict(format!(
            "{} already exists with other content and is written once; it was left as it is",
            path.display()
        )));
    }
    replace(tmp, path, Old::Remove).map_err(failed)
}

/// Whether the regular files `a` and `b` hold the same bytes (`false` when either cannot be read).
fn same_content(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (Ok((mut a, meta_a)), Ok((mut b, meta_b))) = (
        crate::state_file::open_regular(a),
        crate::state_file::open_regular(b),
    ) else {
        return false;
    };
    if meta_a.len() != meta_b.len() {
        return false;
    }
    let (mut buf_a, mut buf_b) = (vec![0; 64 << 10], vec![0; 64 << 10]);
    loop {
        let Ok(n) = a.read(&mut buf_a) else {
            return false;
        };
        if n == 0 {
            // The lengths agreed, so `b` must end here too.
            return b.read(&mut buf_b[..1]).is_ok_and(|m| m == 0);
        }
        if b.read_exact(&mut buf_b[..n]).is_err() || buf_a[..n] != buf_b[..n] {
            return false;
        }
    }
}

/// A write-once file streamed piece by piece (a monthly archive, which need not fit in memory):
/// a buffered temp file beside its path, put in place by [`PendingFile::commit_once`] and
/// removed if dropped before.
pub(super) struct PendingFile {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<ProjectionWriter>,
}

impl PendingFile {
    pub(super) fn create(path: &Path) -> Result<PendingFile> {
        make_parent_dir(path)?;
        let (tmp, file) = create_temp(path).map_err(|e| {
            LoopxError::internal(format!("creating a temp file for {}", path.display()), e)
        })?;
        Ok(PendingFile {
            path: path.to_path_buf(),
            tmp,
            out: Some(BufWriter::with_capacity(64 << 10, file)),
        })
    }

    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let out = self.out.as_mut().expect("written only before commit");
        out.write_all(bytes)
            .map_err(|e| LoopxError::internal(format!("writing {}", self.path.display()), e))
    }

    /// Puts the file in place, unless one was written there meanwhile (a conflict).
    pub(super) fn commit_once(mut self) -> Result<()> {
        let out = self.out.take().expect("committed once");
        let done = out
            .into_inner()
            .map_err(|e| {
                LoopxError::internal(format!("writing {}", self.path.display()), e.into_error())
            })
            .and_then(|_| put_once(&self.tmp, &self.path));
        if done.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        done
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        // Committed, the temp file was renamed (or exchanged and unlinked): nothing to remove.
        if self.out.is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_planted_at_a_stamp_is_replaced_not_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("loopx.db");
        std::fs::write(&precious, b"SQLite format 3").unwrap();
        let path = dir.path().join("state.json");
        std::os::unix::fs::symlink(&precious, stamp_path(&path)).unwrap();
        write_json_projection(&path, |w| w.write_all(b"{}")).unwrap();
        std::fs::remove_file(stamp_path(&path)).unwrap();
        std::fs::hard_link(&precious, stamp_path(&path)).unwrap();
        write_json_projection(&path, |w| w.write_all(b"[]")).unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"SQLite format 3");
        let written = std::fs::metadata(&path).unwrap();
        assert_eq!(read_stamp(&path), Some(stamp_of(&written)));
    }

    #[test]
    fn a_write_once_file_is_never_replaced_but_an_empty_one_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        write_once(&path, b"{\"first\": 1}").unwrap();
        let first = std::fs::metadata(&path).unwrap().ino();
        // The same record rendered by a second process is already there: nothing to report.
        write_once(&path, b"{\"first\": 1}").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), first);
        let err = write_once(&path, b"{\"second\": 2}").unwrap_err();
        assert!(matches!(err, LoopxError::Conflict(_)), "{err:?}");
        let err = write_once(&path, b"{\"first\": 2}").unwrap_err();
        assert!(
            matches!(err, LoopxError::Conflict(_)),
            "same length: {err:?}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"first\": 1}");
        // What a power cut leaves of a file renamed into place.
        std::fs::write(&path, b"").unwrap();
        write_once(&path, b"{\"third\": 3}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{\"third\": 3}");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["report.json"]);
    }

    #[test]
    fn write_stamp_is_rewritten_in_place_and_covers_a_longer_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let stamp = stamp_path(&path);
        std::fs::write(&stamp, [b'9'; 200]).unwrap();
        let stamp_inode = std::fs::metadata(&stamp).unwrap().ino();
        for content in [&b"{}"[..], b"{\"a\": 1}", b"[]"] {
            write_json_projection(&path, |w| w.write_all(content)).unwrap();
            let written = std::fs::metadata(&path).unwrap();
            assert_eq!(read_stamp(&path), Some(stamp_of(&written)));
            assert_eq!(std::fs::metadata(&stamp).unwrap().ino(), stamp_inode);
        }
    }
}
