//! Putting a written file under its name: the exchange that swaps it in and keeps or drops the
//! file it displaces, the rename that refuses to replace anything (write-once files), the
//! exclusive creation of the temp files both start from, and the in-kernel copy that fills one
//! from another. Below `files.rs` and `spare.rs`, which decide what is written where.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Creates the temp file a write of `path` goes through ([`crate::state_file::temp_path`]).
/// Only a file this call creates is written: a name already taken (by another thread's write of
/// the same file, a file left by a killed process that had this pid, or a link planted to make
/// the write land elsewhere) is left alone and the next numbered name tried.
pub(super) fn create_temp(path: &Path) -> std::io::Result<(PathBuf, File)> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NUMBERED: AtomicU32 = AtomicU32::new(1);
    let mut tmp = crate::state_file::temp_path(path);
    for _ in 0..16 {
        match File::options().write(true).create_new(true).open(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let n = NUMBERED.fetch_add(1, Ordering::Relaxed);
                tmp = crate::state_file::numbered_temp_path(path, n);
            }
            created => return created.map(|file| (tmp, file)),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!("every temp name tried for {} is taken", path.display()),
    ))
}

/// Appends `len` bytes of `from`, starting at byte `at`, to `to` at its current offset. The bytes
/// are copied inside the kernel (`copy_file_range`, which on the same filesystem may share or
/// copy pages without them entering this process) where it can, otherwise read and written.
/// `from`'s own offset is neither used nor moved, so a caller copies the parts around an edit
/// without seeking (`std::io::copy` would also stat both files before and after each part).
/// A `from` shorter than `at + len` is `UnexpectedEof`: the caller read its length earlier.
pub(super) fn copy_range(from: &File, at: u64, len: u64, to: &mut File) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    let (mut at, mut len) = (at, len);
    let short = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
    #[cfg(target_os = "linux")]
    while len > 0 {
        use std::os::fd::AsRawFd;
        let Ok(mut offset) = libc::loff_t::try_from(at) else {
            break;
        };
        let chunk = usize::try_from(len).unwrap_or(usize::MAX).min(1 << 30);
        // SAFETY: both descriptors are open for the call's duration; `offset` is a live local
        // the kernel reads and advances; a null output offset means `to`'s file offset.
        let copied = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut offset,
                to.as_raw_fd(),
                std::ptr::null_mut(),
                chunk,
                0,
            )
        };
        match copied {
            0 => return Err(short()),
            n if n > 0 => {
                at += n as u64;
                len -= n as u64;
            }
            _ => {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => {}
                    // Not between these files (another filesystem on older kernels, a
                    // filesystem without it): the plain copy below.
                    Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL) => break,
                    _ => return Err(err),
                }
            }
        }
    }
    let mut buf = vec![0; usize::try_from(len).unwrap_or(usize::MAX).min(1 << 16)];
    while len > 0 {
        let want = buf.len().min(usize::try_from(len).unwrap_or(usize::MAX));
        let n = from.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(short());
        }
        to.write_all(&buf[..n])?;
        at += n as u64;
        len -= n as u64;
    }
    Ok(())
}

/// What becomes of the file a replacement puts out of place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(super) enum Old {
    /// Unlinked: readers that have it open keep reading it whole.
    Remove,
    /// Kept under the name the new content came from, as the projection's next spare, if it is
    /// a regular file with no other name.
    KeepAsSpare,
}

/// Puts `tmp` in `path`'s place. On Linux the two are exchanged (`renameat2` with
/// `RENAME_EXCHANGE`) and the old content, now at `tmp`, is unlinked or kept as `old` says. A plain rename over an
/// existing file makes ext4 allocate and start writing the new file at once (its `auto_da_alloc`
/// safeguard), and the next fsync of the database, a command later, then waits for that data
/// (docs/benchmarks.md has what both cost).
/// Where exchange is unsupported, or there is no old file, it is a plain rename.
///
/// Only a regular file or a symlink (whose target is left alone) is replaced. Anything else in
/// the path's place (an operator's directory, a FIFO, a device) was put there by someone, so it
/// is exchanged back and the write fails naming it: an exchange would otherwise move it to a
/// temp name that `gc` deletes, and a plain rename refuses a directory but takes a FIFO's place.
pub(super) fn replace(tmp: &Path, path: &Path, old: Old) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        match exchange(tmp, path) {
            Ok(()) => {
                let meta = std::fs::symlink_metadata(tmp)?;
                let kind = meta.file_type();
                if kind.is_file() && old == Old::KeepAsSpare && meta.nlink() == 1 {
                    return Ok(());
                }
                if kind.is_file() || kind.is_symlink() {
                    return std::fs::remove_file(tmp);
                }
                exchange(tmp, path)?;
                return Err(not_a_file_in_place(kind));
            }
            Err(err) => match err.raw_os_error() {
                Some(libc::ENOENT | libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {}
                _ => return Err(err),
            },
        }
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() && !meta.file_type().is_symlink() => {
            Err(not_a_file_in_place(meta.file_type()))
        }
        _ => std::fs::rename(tmp, path),
    }
}

/// `renameat2(RENAME_EXCHANGE)`: swaps the two entries atomically.
#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    renameat2(a, b, libc::RENAME_EXCHANGE)
}

/// `renameat2` with `flags`, both paths relative to the working directory.
#[cfg(target_os = "linux")]
fn renameat2(a: &Path, b: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: both arguments are valid NUL-terminated paths that outlive the call.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The failure to replace something that is not a file: `EISDIR` for a directory (exit 6, "a
/// directory where a file belongs"), otherwise a name taken by a FIFO, socket or device.
fn not_a_file_in_place(kind: std::fs::FileType) -> std::io::Error {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        return std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "a directory is in its place; move it aside, and the next write of the projection \
             puts the file back",
        );
    }
    let what = if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "{what} is in its place; move it aside, and the next write of the projection puts \
             the file back"
        ),
    )
}

/// `renameat2(RENAME_NOREPLACE)`: fails with `EEXIST` instead of replacing `to`.
#[cfg(target_os = "linux")]
pub(super) fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    renameat2(from, to, libc::RENAME_NOREPLACE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};

    #[test]
    fn copy_range_appends_the_range_and_leaves_the_source_offset_alone() {
        let dir = tempfile::tempdir().unwrap();
        let src_path = dir.path().join("src");
        // Larger than one read of the fallback and not a multiple of a page.
        let content: Vec<u8> = (0..200_003u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&src_path, &content).unwrap();
        let mut from = File::open(&src_path).unwrap();
        from.seek(std::io::SeekFrom::Start(7)).unwrap();
        let mut to = File::create(dir.path().join("dst")).unwrap();
        to.write_all(b"head:").unwrap();
        copy_range(&from, 0, 100_000, &mut to).unwrap();
        to.write_all(b"|edit|").unwrap();
        copy_range(&from, 100_010, content.len() as u64 - 100_010, &mut to).unwrap();
        copy_range(&from, content.len() as u64, 0, &mut to).unwrap();
        drop(to);
        let mut want = b"head:".to_vec();
        want.extend_from_slice(&content[..100_000]);
        want.extend_from_slice(b"|edit|");
        want.extend_from_slice(&content[100_010..]);
        assert_eq!(std::fs::read(dir.path().join("dst")).unwrap(), want);
        assert_eq!(from.stream_position().unwrap(), 7);
    }

    #[test]
    fn copy_range_past_the_end_of_the_source_is_unexpected_eof() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("src"), b"0123456789").unwrap();
        let from = File::open(dir.path().join("src")).unwrap();
        let mut to = File::create(dir.path().join("dst")).unwrap();
        let err = copy_range(&from, 4, 10, &mut to).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
        // What the source held up to its end was copied before the end was found.
        assert_eq!(std::fs::read(dir.path().join("dst")).unwrap(), b"456789");
    }
}
