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
        let file = crate::state_file::open_own_file(&path)
            .map_err(|e| LoopxError::internal(format!("opening {}", path.display()), e))?;
        match crate::state_file::lock_exclusively(&file) {
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
