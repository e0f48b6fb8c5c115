//! The spare file a projection's next content is written into: its previous generation, kept
//! beside it (`.<name>.spare`) by the exchange that put the current one in place.
//!
//! Why this exists: replacing a file through a new temp file allocates an inode and fresh blocks
//! on every write and frees the old ones, which on ext4 costs more than writing the content
//! (docs/benchmarks.md). Writing into the previous generation instead overwrites pages that are
//! already there. But that file may still be open in a reader that opened the projection before
//! it was replaced (a pager, a slow pipe), and overwriting it would show that reader part of two
//! versions. So the spare is written only under a write lease (`F_SETLEASE`), which the kernel
//! grants only while no other open file description of the file exists, and which holds any new
//! `open` of it off until released. Whenever the lease or any check below fails, the write goes
//! through a fresh temp file instead: the spare only ever saves time, it never decides what a
//! reader sees.
//!
//! Two writers of one projection cannot both use its spare: the writer holding the lease keeps
//! the file open until it has exchanged it into place, and the other's lease needs it closed;
//! and a lease taken on a file no longer at the spare's name (exchanged away meanwhile) is
//! dropped unused.

use std::fs::File;
use std::io::Seek;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The name of the spare of `path`.
pub(super) fn spare_path(path: &Path) -> PathBuf {
    crate::state_file::companion_path(path, "spare")
}

/// A projection's spare, open for writing under this process's write lease.
pub(super) struct Spare {
    file: File,
    path: PathBuf,
}

/// `fcntl`'s `F_SETSIG` (Linux, every architecture), which the `libc` crate does not define
/// for glibc targets.
const F_SETSIG: libc::c_int = 10;

impl Spare {
    /// The spare of `path`, made if missing, if it can be written without any reader seeing it
    /// change: a regular file whose only name is the spare's, open nowhere else. `None` sends the
    /// write through a fresh temp file.
    pub(super) fn lease(path: &Path) -> Option<Spare> {
        let spare = spare_path(path);
        // Not following a link, nor waiting for another writer's lease to be released.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&spare)
            .ok()?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        // A lease is broken by a signal to its holder, SIGIO unless set otherwise, and SIGIO
        // ends a process. SIGURG is ignored unless a handler is installed, and none is: someone
        // opening the spare while it is written then just waits for the lease's release.
        // SAFETY: `fd` is open for the duration of both calls, which take integer arguments.
        let leased = unsafe {
            libc::fcntl(fd, F_SETSIG, libc::SIGURG) == 0
                && libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) == 0
        };
        if !leased {
            return None;
        }
        let held = Spare { file, path: spare };
        held.is_its_only_name().then_some(held)
    }

    /// Whether the leased file is a regular file still at the spare's name and at no other: a
    /// hard link planted there must not make a projection write into what it links to.
    fn is_its_only_name(&self) -> bool {
        let (Ok(open), Ok(named)) = (self.file.metadata(), std::fs::symlink_metadata(&self.path))
        else {
            return false;
        };
        open.is_file()
            && open.nlink() == 1
            && (open.dev(), open.ino()) == (named.dev(), named.ino())
    }

    /// Writes `path`'s next content into the spare through `write` (which may decline, leaving
    /// `path` alone) and exchanges it into `path`'s place, keeping the old content as the next
    /// spare. Returns the stat of the file written.
    pub(super) fn write_into(
        self,
        path: &Path,
        write: impl FnOnce(File) -> std::io::Result<Option<File>>,
    ) -> std::io::Result<Option<std::fs::Metadata>> {
        let Spare { file, path: spare } = self;
        let Some(mut file) = write(file)? else {
            return Ok(None);
        };
        let len = file.stream_position()?;
        let mut meta = file.metadata()?;
        // The previous generation may have been longer.
        if meta.len() != len {
            file.set_len(len)?;
            meta = file.metadata()?;
        }
        // Released before the exchange, so no reader of `path` ever waits on it; the file stays
        // open until then, which keeps another writer from leasing it meanwhile.
        // SAFETY: the descriptor is open; the call takes integer arguments.
        unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                libc::F_SETLEASE,
                libc::F_UNLCK,
            )
        };
        match super::place::replace(&spare, path, super::place::Old::KeepAsSpare) {
            Ok(()) => Ok(Some(meta)),
            // The spare was removed while it was written (by hand, or by someone else's
            // cleanup): what it held is still open here, so it goes through a temp file.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let (tmp, mut to) = super::place::create_temp(path)?;
                let written = (|| {
                    super::place::copy_range(&file, 0, len, &mut to)?;
                    let meta = to.metadata()?;
                    drop(to);
                    super::place::replace(&tmp, path, super::place::Old::Remove)?;
                    Ok(Some(meta))
                })();
                if written.is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
                written
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;

    use super::*;
    use crate::kernel::projection::files::write_atomic;

    fn inode(path: &Path) -> u64 {
        std::fs::metadata(path).unwrap().ino()
    }

    #[test]
    fn the_previous_generation_is_written_next_when_nobody_has_it_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"[1]").unwrap();
        let first = inode(&path);
        write_atomic(&path, b"[2, 2]").unwrap();
        assert_eq!(inode(&spare_path(&path)), first);
        write_atomic(&path, b"[3]").unwrap();
        assert_eq!(inode(&path), first);
        assert_eq!(std::fs::read(&path).unwrap(), b"[3]");
        assert_eq!(std::fs::read(spare_path(&path)).unwrap(), b"[2, 2]");
    }

    #[test]
    fn a_reader_of_an_old_generation_keeps_reading_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("STATE.md");
        write_atomic(&path, b"first generation\n").unwrap();
        let mut reader = File::open(&path).unwrap();
        write_atomic(&path, b"second\n").unwrap();
        // The first generation is the spare now, and still open in the reader.
        write_atomic(&path, b"third generation, longer than the first\n").unwrap();
        let mut seen = String::new();
        reader.read_to_string(&mut seen).unwrap();
        assert_eq!(seen, "first generation\n");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"third generation, longer than the first\n"
        );
    }

    #[test]
    fn a_link_planted_at_the_spare_or_temp_name_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("precious");
        std::fs::write(&precious, b"keep me").unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"[0]").unwrap();

        std::fs::remove_file(spare_path(&path)).ok();
        std::fs::hard_link(&precious, spare_path(&path)).unwrap();
        write_atomic(&path, b"[1]").unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
        assert_eq!(std::fs::read(&path).unwrap(), b"[1]");

        std::fs::remove_file(spare_path(&path)).unwrap();
        std::os::unix::fs::symlink(&precious, spare_path(&path)).unwrap();
        write_atomic(&path, b"[2]").unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
        assert_eq!(std::fs::read(&path).unwrap(), b"[2]");

        // With the spare unusable, the write goes through this process's temp name.
        std::fs::remove_file(spare_path(&path)).unwrap();
        std::fs::create_dir(spare_path(&path)).unwrap();
        let tmp = crate::state_file::temp_path(&path);
        std::os::unix::fs::symlink(&precious, &tmp).unwrap();
        write_atomic(&path, b"[3]").unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"keep me");
        assert_eq!(std::fs::read(&path).unwrap(), b"[3]");
        assert_eq!(std::fs::read_link(&tmp).unwrap(), precious);
    }

    #[test]
    fn opening_the_spare_while_it_is_written_waits_and_kills_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"[1]").unwrap();
        write_atomic(&path, b"[2]").unwrap();
        let held = Spare::lease(&path).expect("a spare nobody has open");
        // The open breaks the lease, which signals this process (SIGIO would end it).
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(spare_path(&path));
        assert_eq!(
            opened.unwrap_err().raw_os_error(),
            Some(libc::EWOULDBLOCK),
            "a leased spare is not opened until the lease is released"
        );
        // Nor can a second writer take it.
        assert!(Spare::lease(&path).is_none());
        drop(held);
        assert!(Spare::lease(&path).is_some());
    }

    #[test]
    fn concurrent_writers_and_a_reader_only_ever_see_whole_generations() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        // Generation k is `k` repeated over a length of its own.
        let generation = |k: u8| vec![b'a' + k; 1000 + usize::from(k) * 23_000];
        write_atomic(&path, &generation(0)).unwrap();
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..4u8)
                .map(|w| {
                    let path = &path;
                    s.spawn(move || {
                        for i in 0..150u8 {
                            write_atomic(path, &generation((w * 3 + i) % 8))?;
                        }
                        Ok::<_, crate::error::LoopxError>(())
                    })
                })
                .collect();
            let reader = s.spawn(|| {
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut file) = File::open(&path) else {
                        continue;
                    };
                    let mut bytes = Vec::new();
                    // Read in small pieces, so writes can land between them.
                    let mut piece = [0; 4096];
                    loop {
                        let n = file.read(&mut piece).unwrap();
                        if n == 0 {
                            break;
                        }
                        bytes.extend_from_slice(&piece[..n]);
                    }
                    let k = bytes[0] - b'a';
                    assert!(
                        bytes == generation(k),
                        "a read saw part of two generations ({} bytes, first {:?})",
                        bytes.len(),
                        char::from(bytes[0])
                    );
                    reads += 1;
                }
                reads
            });
            let written: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            assert!(reader.join().unwrap() > 0);
            for w in written {
                w.unwrap();
            }
        });
        let litter: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp"))
            .collect();
        assert!(litter.is_empty(), "{litter:?}");
    }
}
