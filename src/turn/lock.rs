//! Which process drives a turn: the per-turn `flock`, and the test-only crash hook.
//!
//! Why this exists: a process that drives or recovers a turn holds an exclusive lock on
//! `.loopx/turns/<turn-key>.lock`; the OS drops it when the process dies (even by SIGKILL), so
//! recovery takes over only turns whose driver is gone. It is a POSIX record lock (`fcntl`),
//! which belongs to the process, not a `flock`, which belongs to the open file and so is shared
//! by every child forked while it is held: the host's child, between its fork and its `exec`,
//! kept a dead driver's turn locked until the parent-death signal reached it, and a `turn
//! recover` run in that moment left the turn unsettled. The crash hook kills the process right
//! after a commit, which is how the tests prove that recovery finishes every phase exactly once.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use crate::error::{LoopxError, Result};
use crate::kernel::Kernel;

/// Env var naming a phase after whose commit the driver SIGKILLs itself. Test-only.
pub const CRASH_HOOK_ENV: &str = "LOOPX_TEST_CRASH_AFTER";

/// Holds `.loopx/turns/<key>.lock` exclusively while a process drives or recovers a turn.
pub(crate) struct TurnLock {
    _file: File,
    path: PathBuf,
}

impl TurnLock {
    pub(crate) fn try_acquire(kernel: &Kernel, turn_key: &str) -> Result<Option<TurnLock>> {
        let dir = kernel.paths().state.join("turns");
        std::fs::create_dir_all(&dir)
            .map_err(|e| LoopxError::internal(format!("creating {}", dir.display()), e))?;
        let path = dir.join(format!("{turn_key}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| LoopxError::internal(format!("opening {}", path.display()), e))?;
        match lock_exclusively(&file) {
            Ok(true) => Ok(Some(TurnLock { _file: file, path })),
            Ok(false) => Ok(None),
            Err(err) => Err(LoopxError::internal(
                format!("locking {}", path.display()),
                err,
            )),
        }
    }

    /// This process is done with the turn (settled, or given up on an error): removes the lock
    /// file and releases the lock. A later recoverer creates a fresh file; whatever it finds, it
    /// re-reads the journal under its own lock before acting.
    pub(crate) fn finish(self) {}
}

impl Drop for TurnLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes this process's exclusive record lock on the whole file without waiting; `false` when
/// another process holds it.
fn lock_exclusively(file: &File) -> std::io::Result<bool> {
    let whole_file = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    // SAFETY: fcntl on a file descriptor we own, with a valid `struct flock`.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &whole_file) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EAGAIN | libc::EACCES) => Ok(false),
        _ => Err(err),
    }
}

/// Test-only crash injection: SIGKILL this process right after `phase` committed. Compiled only
/// with the `test-hooks` feature, which the crate's own test builds enable (Cargo.toml).
#[cfg(feature = "test-hooks")]
pub(crate) fn crash_hook(point: &str) {
    if std::env::var(CRASH_HOOK_ENV).is_ok_and(|p| p == point) {
        // SAFETY: plain syscalls; the process ends here.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        std::process::abort();
    }
}

/// Release builds and `cargo build` have no crash hook: the call sites compile to nothing.
#[cfg(not(feature = "test-hooks"))]
pub(crate) fn crash_hook(_point: &str) {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;

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
