//! Reading the files LoopX keeps beside its database (projections, write stamps, records).
//!
//! Why this exists: `.loopx/` is a directory anyone with the project's permissions can change,
//! and every command reads some of it before it does anything (the registry projection's check,
//! the state files' stamps). A FIFO put where `registry.json` was made every command block in
//! `open` forever; a symlink to `/dev/zero` made one allocate until the kernel killed it. So
//! these reads open without blocking, accept only a regular file, and read at most a bound:
//! anything else is an error the caller reports (a damaged projection is exit 5), never a hang.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The temp file a write of `path` goes through before it is put in place whole:
/// `.<name>.<pid>.tmp` beside it. The writer's pid in the name keeps two processes writing one
/// file apart, and lets `gc` tell the temp file of a write that was killed
/// ([`temp_writer_pid`]) from one in progress.
pub fn temp_path(path: &Path) -> PathBuf {
    companion_path(path, &format!("{}.tmp", std::process::id()))
}

/// The `n`th other temp name of `path` for this process, `.<name>.<pid>~<n>.tmp`: for a write of
/// a file another of its threads is writing, or whose [`temp_path`] is taken by something else.
pub fn numbered_temp_path(path: &Path, n: u32) -> PathBuf {
    companion_path(path, &format!("{}~{n}.tmp", std::process::id()))
}

/// `.<name>.<suffix>` beside `path`: the hidden companions of a file (its temp files, its write
/// stamp, its spare).
pub fn companion_path(path: &Path, suffix: &str) -> PathBuf {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    path.with_file_name(format!(".{name}.{suffix}"))
}

/// Whether a process with this pid exists (it may not be the writer: a reused pid keeps the file
/// until a later `gc`, which errs on the side of keeping).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 checks for the process's existence and sends nothing.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Opens a file LoopX keeps beside its database for writing (a write stamp, a lock file),
/// creating it if missing, but only a regular file whose only name is `path`, reached without
/// following a link. A link planted at such a predictable name would otherwise make the write
/// land in whatever it points to, the database included, and a lock taken on it would be
/// released with every other lock this process holds on that file (SQLite's among them) when
/// the lock file is closed. Anything else is `InvalidInput`, naming the file.
pub fn open_own_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    let not_ours = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is a link, or a file with another name too, not one LoopX made; move it aside",
                path.display()
            ),
        )
    };
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => not_ours(),
            _ => e,
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.nlink() != 1 {
        return Err(not_ours());
    }
    Ok(file)
}

/// Creates the file `path` names for this process alone (a temp file whose name carries its
/// pid, and thread where it matters): whatever already has the name was left by a killed process
/// that had the same pid, or planted, and is removed rather than opened, so the write never lands
/// where a planted link points.
pub fn create_fresh(path: &Path) -> io::Result<File> {
    let create = || File::options().write(true).create_new(true).open(path);
    match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(path)?;
            create()
        }
        created => created,
    }
}

/// Takes this process's exclusive record lock on the whole file without waiting; `false` when
/// another process holds it. A POSIX record lock (`fcntl`) belongs to the process, so the OS
/// drops it when the process dies and a child forked meanwhile never holds it (a `flock` is
/// shared with every such child until it execs or exits).
pub fn lock_exclusively(file: &File) -> std::io::Result<bool> {
    let whole_file = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: fcntl on a file descriptor we own, with a valid `struct flock`.
    let rc = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(file),
            libc::F_SETLK,
            &whole_file,
        )
    };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(err),
    }
}

/// Removes the temp files of earlier writes of `path` (named by [`temp_path`], with SQLite's
/// companions) whose writers are gone: what a killed write left beside a file outside `.loopx/`,
/// where `gc` does not look. Best effort: a file that cannot be removed stays.
pub fn remove_stale_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let prefix = format!(".{name}.");
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if file_name.starts_with(&prefix)
            && let Some(pid) = temp_writer_pid(file_name)
            && pid != std::process::id()
            && !process_alive(pid)
            && entry.file_type().is_ok_and(|t| t.is_file())
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// The pid of the writer of a temp file named by [`temp_path`], or `None` for any other name.
/// SQLite's companions of a temp database (`-wal`, `-shm`, `-journal`) count as its own.
pub fn temp_writer_pid(file_name: &str) -> Option<u32> {
    let file_name = ["-wal", "-shm", "-journal"]
        .iter()
        .find_map(|suffix| file_name.strip_suffix(suffix))
        .unwrap_or(file_name);
    let rest = file_name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (name, pid) = rest.rsplit_once('.')?;
    let (pid, n) = pid.split_once('~').unwrap_or((pid, "0"));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if name.is_empty() || !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok()
}

/// Opens `path` for reading if it is a regular file, with its metadata. `O_NONBLOCK` keeps
/// `open` of a FIFO or a device from waiting for a writer; it changes nothing for a regular
/// file's reads.
pub fn open_regular(path: &Path) -> io::Result<(File, std::fs::Metadata)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", path.display()),
        ));
    }
    Ok((file, meta))
}

/// The whole of the regular file at `path`, refused (`FileTooLarge`) above `max` bytes.
pub fn read_bounded(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    let (file, meta) = open_regular(path)?;
    let too_large = || {
        io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("{} is larger than {max} bytes", path.display()),
        )
    };
    let len = meta.len();
    if len > max {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(len as usize);
    // The file may grow between the `stat` and the read.
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

/// [`read_bounded`] as UTF-8 text.
pub fn read_bounded_text(path: &Path, max: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, max)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not UTF-8 text", path.display()),
        )
    })
}

/// The most a JSON projection (`registry.json`, a goal's `state.json`, a run report) may hold:
/// far above what the live window renders, far below what would exhaust memory.
pub const MAX_PROJECTION_BYTES: u64 = 256 << 20;
/// The most a small record (a write stamp, a probe record, the test clock) may hold.
pub const MAX_RECORD_BYTES: u64 = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_fresh_file_replaces_what_had_its_name_without_writing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("loopx.db");
        std::fs::write(&precious, b"SQLite format 3").unwrap();
        let tmp = dir.path().join(".x.12.tmp");
        std::os::unix::fs::symlink(&precious, &tmp).unwrap();
        let mut file = create_fresh(&tmp).unwrap();
        std::io::Write::write_all(&mut file, b"new").unwrap();
        assert_eq!(std::fs::read(&precious).unwrap(), b"SQLite format 3");
        assert_eq!(std::fs::read(&tmp).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&tmp).unwrap().is_file());
    }

    #[test]
    fn an_own_file_is_never_opened_through_a_link() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let precious = dir.path().join("loopx.db");
        std::fs::write(&precious, b"SQLite format 3").unwrap();
        let symlink = dir.path().join("gc.lock");
        std::os::unix::fs::symlink(&precious, &symlink).unwrap();
        let hard = dir.path().join(".state.json.stamp");
        std::fs::hard_link(&precious, &hard).unwrap();
        for planted in [&symlink, &hard] {
            let err = open_own_file(planted).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
            assert!(err.to_string().contains("move it aside"), "{err}");
        }
        assert_eq!(std::fs::read(&precious).unwrap(), b"SQLite format 3");
        let fresh = dir.path().join("turn.lock");
        let file = open_own_file(&fresh).unwrap();
        assert_eq!(file.metadata().unwrap().nlink(), 1);
        assert!(
            open_own_file(&fresh).is_ok(),
            "an existing file of its own opens again"
        );
    }

    #[test]
    fn both_temp_names_tell_their_writer_and_nothing_else_does() {
        let path = Path::new("/p/.loopx/goals/g/state.json");
        let name = |p: PathBuf| p.file_name().unwrap().to_str().unwrap().to_string();
        let me = Some(std::process::id());
        assert_eq!(temp_writer_pid(&name(temp_path(path))), me);
        assert_eq!(temp_writer_pid(&name(numbered_temp_path(path, 7))), me);
        assert_eq!(temp_writer_pid(".loopx.db.12.tmp-journal"), Some(12));
        for other in [
            "state.json",
            ".state.json.spare",
            ".state.json.stamp",
            ".state.json.12~.tmp",
            ".state.json.~3.tmp",
            ".state.json.12~x.tmp",
            "..12.tmp",
        ] {
            assert_eq!(temp_writer_pid(other), None, "{other}");
        }
    }

    #[test]
    fn only_regular_files_within_the_bound_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_bounded(&file, 5).unwrap(), b"12345");
        assert_eq!(
            read_bounded(&file, 4).unwrap_err().kind(),
            io::ErrorKind::FileTooLarge
        );
        assert_eq!(
            read_bounded(dir.path(), 5).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // A FIFO with no writer: refused at once instead of waiting in `open`.
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        assert_eq!(
            read_bounded(&fifo, 5).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // A device that never ends.
        assert_eq!(
            read_bounded(Path::new("/dev/zero"), 5).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("z")).unwrap();
        assert_eq!(
            read_bounded(&dir.path().join("z"), 5).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_child_forked_while_the_lock_is_held_does_not_keep_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.lock");
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .unwrap()
        };
        let held = open();
        assert!(lock_exclusively(&held).unwrap());
        // A child that lingers between its fork and its exec, as the host's child does while
        // its parent-death signal is on the way.
        let mut child = std::process::Command::new("true");
        // SAFETY: the closure only sleeps, which is async-signal-safe.
        unsafe {
            child.pre_exec(|| {
                libc::usleep(1_500_000);
                Ok(())
            });
        }
        let mut child = child.spawn().unwrap();
        // The holder closes its descriptor (as a killed driver's are): the lock is free at once,
        // though the child still has its inherited copy of the descriptor.
        drop(held);
        let again = open();
        assert!(
            lock_exclusively(&again).unwrap(),
            "the forked child kept the lock"
        );
        child.wait().unwrap();
    }
}
