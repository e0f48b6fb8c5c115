//! Noticing that another process committed, without re-reading state on a timer.
//!
//! Long-lived readers (the dashboard's event stream, `status --watch`) must redraw when any
//! process commits, and cost nothing while none does. A commit always writes the database's
//! write-ahead log (or, after a checkpoint, the database file), so on Linux the watcher sleeps on
//! an inotify descriptor watching `.loopx/` and wakes when one of those two files is written.
//! A file event is only a hint: checkpoints, projections renamed into `.loopx/` and the writer's
//! own WAL frames before its commit record is published also write there. Two numbers of the
//! store decide: its change counter ([`Store::data_version`], SQLite's `PRAGMA data_version`,
//! one look at the WAL index) never moves on a read, so an unmoved counter ends the check; it can
//! move on another connection's checkpoint, so a moved one is confirmed by the operation log's
//! position ([`Store::op_log_position`]), which moves with every committed kernel mutation and
//! nothing else.
//!
//! SQLite writes a commit's frames to the WAL before it publishes the commit in the WAL index
//! (shared memory, which no file event reports), so the numbers may not have moved yet when the
//! event arrives. After any event the watcher therefore re-reads the counter a few times, 2 ms
//! apart and doubling up to 50 ms, for [`SETTLE`] (longer than any fsync the commit waits for),
//! then sleeps on the descriptor again. Other systems have no inotify here; there the watcher
//! reads the counter every 50 ms, which costs one shared-memory read per poll.
//!
//! The database an operator restores is another file put at the same path, and `.loopx/` may be
//! moved aside and brought back: the watcher's open store would then keep reading the old file
//! and its directory watch would be gone, so a page would stop updating while it said it was
//! live. Each check therefore compares the file at the path with the one the store has open (one
//! `stat`) and reopens both when they differ, which reports a change; while `.loopx/` is gone it
//! looks for it every [`MISSING_POLL`].

use std::time::{Duration, Instant};

use crate::error::Result;
use crate::kernel::store::{Backend, SchemaUpgrade, Store};
use crate::paths::ProjectPaths;

/// How long after a file event the watcher keeps re-reading the change counter.
const SETTLE: Duration = Duration::from_secs(2);
/// The first and the longest pause between re-reads after an event (and the poll interval where
/// there is no inotify).
const FIRST_RECHECK: Duration = Duration::from_millis(2);
const MAX_RECHECK: Duration = Duration::from_millis(50);
/// How often the watcher looks for the project's state directory or database while either is
/// missing (no directory to watch).
const MISSING_POLL: Duration = Duration::from_millis(250);

/// How long a file at the database's path may stay unopenable (a restore still copying it in)
/// before the watcher reports why instead of waiting on.
const UNOPENABLE_GRACE: Duration = Duration::from_secs(2);

/// Which file a path names (device and inode): a file renamed into place is another file.
type FileIdentity = (u64, u64);

fn file_identity(path: &std::path::Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Wakes when another process (or another handle in this one) commits to the project's store.
pub struct ChangeWatcher {
    paths: ProjectPaths,
    /// Whether a database of an older schema that replaces the watched one is upgraded on
    /// reopening: the CLI's watchers upgrade as every command does, the server's reads never do.
    upgrade: SchemaUpgrade,
    store: Box<dyn Store>,
    /// The database file `store` has open, as it was found at the path before opening it.
    opened: Option<FileIdentity>,
    /// How many times another file at the path has been opened in place of the first.
    replacements: u64,
    /// Since when the file at the path could not be opened, while it cannot.
    unopenable_since: Option<Instant>,
    version: i64,
    position: i64,
    /// `None` once the watched directory is gone (removed or moved aside).
    #[cfg(target_os = "linux")]
    events: Option<inotify::Events>,
}

impl ChangeWatcher {
    /// Starts watching the project at `paths`. Commits after this call are reported by the next
    /// [`ChangeWatcher::wait`].
    pub fn new(paths: &ProjectPaths, upgrade: SchemaUpgrade) -> Result<ChangeWatcher> {
        // The descriptor exists before the counter's first reading, so a commit between the two
        // is seen either by the reading or as an event.
        #[cfg(target_os = "linux")]
        let events = Some(inotify::Events::watch(&paths.state)?);
        // Taken before opening: a file renamed into place in between is then seen as a
        // replacement and opened again, never missed.
        let opened = file_identity(&paths.db());
        let store = crate::kernel::store::open_with(Backend::default(), &paths.db(), upgrade)?;
        let version = store.data_version()?;
        let position = store.op_log_position()?;
        Ok(ChangeWatcher {
            paths: paths.clone(),
            upgrade,
            store,
            opened,
            replacements: 0,
            unopenable_since: None,
            version,
            position,
            #[cfg(target_os = "linux")]
            events,
        })
    }

    /// Blocks until a commit has happened since the previous call (or since [`ChangeWatcher::new`])
    /// and returns true, or returns false once `timeout` (`None`: no limit) has passed without
    /// one. Several commits since the last call are reported once.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut settle_until: Option<Instant> = None;
        let mut recheck = FIRST_RECHECK;
        loop {
            if self.committed()? {
                return Ok(true);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let mut block = deadline.map(|d| d - now);
            if settle_until.is_some_and(|s| now < s) {
                block = Some(block.map_or(recheck, |b| b.min(recheck)));
                recheck = (recheck * 2).min(MAX_RECHECK);
            } else {
                settle_until = None;
            }
            if self.sleep(block)? {
                settle_until = Some(Instant::now() + SETTLE);
                recheck = FIRST_RECHECK;
            }
        }
    }

    /// How many times the database at the path has been replaced by another file (a restore)
    /// and reopened: a reader holding its own handle on the first one must open it again.
    pub fn replacements(&self) -> u64 {
        self.replacements
    }

    /// Whether a commit happened since the last check (and remembers where the store is now).
    fn committed(&mut self) -> Result<bool> {
        if file_identity(&self.paths.db()) != self.opened {
            return self.reopen();
        }
        let version = self.store.data_version()?;
        if version == self.version {
            return Ok(false);
        }
        self.version = version;
        let position = self.store.op_log_position()?;
        let moved = position != self.position;
        self.position = position;
        Ok(moved)
    }

    /// Opens the database now at the path, and watches the directory now at the path, in place
    /// of the ones that were replaced; true (a change: the project's state is another file's)
    /// once both are open. While either is missing, or the file cannot be opened yet (a restore
    /// half done), the old ones are kept and the next check tries again; a file that still
    /// cannot be opened after [`UNOPENABLE_GRACE`] is reported as the error opening it gives
    /// (not a database, a newer schema, ...), so no reader goes on showing the replaced one.
    fn reopen(&mut self) -> Result<bool> {
        let db = self.paths.db();
        let Some(identity) = file_identity(&db) else {
            return Ok(false);
        };
        #[cfg(target_os = "linux")]
        let Ok(events) = inotify::Events::watch(&self.paths.state) else {
            return Ok(false);
        };
        let opened = crate::kernel::store::open_with(Backend::default(), &db, self.upgrade)
            .and_then(|store| Ok((store.data_version()?, store.op_log_position()?, store)));
        let (version, position, store) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                let since = *self.unopenable_since.get_or_insert_with(Instant::now);
                return if since.elapsed() >= UNOPENABLE_GRACE {
                    Err(e)
                } else {
                    Ok(false)
                };
            }
        };
        self.store = store;
        self.opened = Some(identity);
        self.version = version;
        self.position = position;
        self.replacements += 1;
        self.unopenable_since = None;
        #[cfg(target_os = "linux")]
        {
            self.events = Some(events);
        }
        Ok(true)
    }

    /// Sleeps until a file event on the database or its WAL (true) or `block` passes (false);
    /// while the watched directory is gone, for at most [`MISSING_POLL`].
    #[cfg(target_os = "linux")]
    fn sleep(&mut self, block: Option<Duration>) -> Result<bool> {
        let Some(events) = &mut self.events else {
            std::thread::sleep(block.map_or(MISSING_POLL, |b| b.min(MISSING_POLL)));
            return Ok(false);
        };
        let woke = events.next(block)?;
        if events.lost() {
            self.events = None;
        }
        Ok(woke)
    }

    #[cfg(not(target_os = "linux"))]
    fn sleep(&mut self, block: Option<Duration>) -> Result<bool> {
        std::thread::sleep(block.map_or(MAX_RECHECK, |b| b.min(MAX_RECHECK)));
        Ok(false)
    }
}

#[cfg(target_os = "linux")]
mod inotify {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::time::Duration;

    use crate::error::{LoopxError, Result};
    use crate::paths::DB_FILE;

    /// An inotify descriptor watching one directory for writes to the database and its WAL.
    pub(super) struct Events {
        fd: OwnedFd,
        dir: std::path::PathBuf,
        /// The directory was removed or moved away: no event will come from it again.
        lost: bool,
    }

    impl Events {
        pub(super) fn watch(dir: &Path) -> Result<Events> {
            let io_err = |what: &str| {
                LoopxError::io(
                    dir,
                    format!("{what} {} to watch for commits", dir.display()),
                    std::io::Error::last_os_error(),
                )
            };
            // SAFETY: inotify_init1 takes flags only; a non-negative result is a new descriptor
            // this process owns.
            let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            if raw < 0 {
                return Err(io_err("creating an inotify descriptor for"));
            }
            // SAFETY: `raw` was just returned by inotify_init1 and is owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            let c_dir = CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
                crate::error::bad_input(format!(
                    "the state directory {} has a NUL byte in its path",
                    dir.display()
                ))
            })?;
            // A commit writes the WAL (IN_MODIFY); a WAL created anew, or a database swapped in
            // by a restore, arrives as IN_CREATE / IN_MOVED_TO; the directory itself going away
            // as IN_DELETE_SELF / IN_MOVE_SELF (then IN_IGNORED).
            let mask = libc::IN_MODIFY
                | libc::IN_CREATE
                | libc::IN_MOVED_TO
                | libc::IN_DELETE_SELF
                | libc::IN_MOVE_SELF;
            // SAFETY: `fd` is a live inotify descriptor and `c_dir` a NUL-terminated path.
            let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c_dir.as_ptr(), mask) };
            if wd < 0 {
                return Err(io_err("watching"));
            }
            Ok(Events {
                fd,
                dir: dir.to_path_buf(),
                lost: false,
            })
        }

        /// Whether the watched directory went away (see the field).
        pub(super) fn lost(&self) -> bool {
            self.lost
        }

        /// Waits up to `block` (`None`: without limit) for events; true when one of them names
        /// the database or its WAL (or the queue overflowed, which may have hidden one).
        pub(super) fn next(&mut self, block: Option<Duration>) -> Result<bool> {
            let timeout_ms: libc::c_int = match block {
                None => -1,
                // Rounded up, so a wait of 0.5 ms does not become a busy loop of zero waits.
                Some(b) => b
                    .as_micros()
                    .div_ceil(1000)
                    .try_into()
                    .unwrap_or(libc::c_int::MAX),
            };
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
            if ready < 0 {
                let err = std::io::Error::last_os_error();
                if err.kind() == std::io::ErrorKind::Interrupted {
                    return Ok(false);
                }
                return Err(LoopxError::io(
                    &self.dir,
                    format!("waiting for changes in {}", self.dir.display()),
                    err,
                ));
            }
            if ready == 0 {
                return Ok(false);
            }
            self.drain()
        }

        /// Reads every queued event; true when one concerns the database or its WAL.
        fn drain(&mut self) -> Result<bool> {
            // Aligned for `inotify_event`, and large enough for many events per read.
            let mut buf = [0u64; 1024];
            let mut relevant = false;
            loop {
                // SAFETY: the buffer is valid for writes of its full size in bytes.
                let n = unsafe {
                    libc::read(
                        self.fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        std::mem::size_of_val(&buf),
                    )
                };
                if n < 0 {
                    let err = std::io::Error::last_os_error();
                    match err.kind() {
                        std::io::ErrorKind::WouldBlock => return Ok(relevant),
                        std::io::ErrorKind::Interrupted => continue,
                        _ => {
                            return Err(LoopxError::io(
                                &self.dir,
                                format!("reading change events of {}", self.dir.display()),
                                err,
                            ));
                        }
                    }
                }
                if n == 0 {
                    return Ok(relevant);
                }
                // SAFETY: the kernel wrote `n` initialized bytes at the start of `buf`.
                let bytes =
                    unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
                let (database, lost) = read_events(bytes);
                relevant |= database || lost;
                self.lost |= lost;
            }
        }
    }

    /// Whether a buffer of `inotify_event` records names the database or its WAL, and whether
    /// it says the watched directory went away.
    fn read_events(mut bytes: &[u8]) -> (bool, bool) {
        let header = std::mem::size_of::<libc::inotify_event>();
        let mut relevant = false;
        let mut lost = false;
        while bytes.len() >= header {
            // SAFETY: `header` bytes are available; read_unaligned copies them without assuming
            // the slice's alignment.
            let event: libc::inotify_event =
                unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
            let len = event.len as usize;
            let end = (header + len).min(bytes.len());
            let name = &bytes[header..end];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if event.mask & libc::IN_Q_OVERFLOW != 0 || is_database_file(name) {
                relevant = true;
            }
            if event.mask & (libc::IN_DELETE_SELF | libc::IN_MOVE_SELF | libc::IN_IGNORED) != 0 {
                lost = true;
            }
            bytes = &bytes[end..];
        }
        (relevant, lost)
    }

    pub(super) fn is_database_file(name: &[u8]) -> bool {
        let db = DB_FILE.as_bytes();
        name == db || name.strip_prefix(db) == Some(b"-wal")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ChangeWatcher, SchemaUpgrade};
    use crate::kernel::goal::NewGoal;
    use crate::kernel::test_project;
    use crate::kernel::{Actor, Kernel};

    fn new_goal(kernel: &mut Kernel, id: &str) {
        let goal = NewGoal {
            id: Some(id.into()),
            title: "Another goal".into(),
            ..NewGoal::default()
        };
        kernel.create_goal(&Actor::Operator, goal).unwrap();
    }

    #[test]
    fn a_commit_from_another_connection_on_another_thread_wakes_a_waiting_watcher() {
        let (dir, _kernel) = test_project::with_goal_g();
        let paths = crate::paths::ProjectPaths::at(dir.path());
        let mut watcher = ChangeWatcher::new(&paths, SchemaUpgrade::Refuse).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let mut other = Kernel::open(paths).unwrap();
            new_goal(&mut other, "h");
        });
        assert!(watcher.wait(Some(Duration::from_secs(20))).unwrap());
        writer.join().unwrap();
        // Reported once: nothing has been committed since.
        assert!(!watcher.wait(Some(Duration::from_millis(100))).unwrap());
    }

    #[test]
    fn a_commit_made_between_two_waits_is_reported_by_the_next_one() {
        let (dir, mut kernel) = test_project::with_goal_g();
        let mut watcher = ChangeWatcher::new(
            &crate::paths::ProjectPaths::at(dir.path()),
            SchemaUpgrade::Refuse,
        )
        .unwrap();
        new_goal(&mut kernel, "h");
        assert!(watcher.wait(Some(Duration::ZERO)).unwrap());
        assert!(!watcher.wait(Some(Duration::ZERO)).unwrap());
        new_goal(&mut kernel, "i");
        new_goal(&mut kernel, "j");
        assert!(watcher.wait(None).unwrap());
    }

    #[test]
    fn reads_and_a_checkpoint_are_not_commits() {
        let (dir, kernel) = test_project::with_goal_g();
        let paths = crate::paths::ProjectPaths::at(dir.path());
        let mut watcher = ChangeWatcher::new(&paths, SchemaUpgrade::Refuse).unwrap();
        kernel.goals().unwrap();
        kernel.status(None).unwrap();
        // A checkpoint writes the database file (a file event) but commits nothing.
        let conn = rusqlite::Connection::open(paths.db()).unwrap();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let reader = Kernel::open(paths).unwrap();
        reader.goals().unwrap();
        assert!(!watcher.wait(Some(Duration::from_millis(300))).unwrap());
    }

    /// A restore: a copy with one more goal renamed over the database (its WAL and index gone,
    /// as a restore leaves them). The watcher reports it, and then watches the new file.
    #[test]
    fn a_database_put_in_place_of_the_watched_one_is_a_change_and_is_watched_from_then_on() {
        let (dir, mut kernel) = test_project::with_goal_g();
        let paths = crate::paths::ProjectPaths::at(dir.path());
        let mut watcher = ChangeWatcher::new(&paths, SchemaUpgrade::Refuse).unwrap();
        let copy = dir.path().join("restored.db");
        crate::kernel::doctor::backup_database(&paths, &copy).unwrap();
        {
            let mut restored = Kernel::from_store(
                paths.clone(),
                crate::kernel::store::open(crate::kernel::store::Backend::default(), &copy)
                    .unwrap(),
            );
            new_goal(&mut restored, "restored");
        }
        // The copy's commit moved into the file itself, as a backup is.
        rusqlite::Connection::open(&copy)
            .unwrap()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        drop(kernel);
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", paths.db().display()));
            let _ = std::fs::remove_file(format!("{}{suffix}", copy.display()));
        }
        assert_eq!(watcher.replacements(), 0);
        std::fs::rename(&copy, paths.db()).unwrap();
        assert!(watcher.wait(Some(Duration::from_secs(20))).unwrap());
        assert_eq!(watcher.replacements(), 1);
        kernel = Kernel::open(paths.clone()).unwrap();
        assert!(kernel.goals().unwrap().iter().any(|g| g.id == "restored"));
        new_goal(&mut kernel, "after");
        assert!(watcher.wait(Some(Duration::from_secs(20))).unwrap());
    }

    /// A file that is no database put at the path is waited out for a grace period (a restore
    /// may still be copying it in), then reported as the error opening it gives.
    #[test]
    fn a_file_that_stays_unopenable_at_the_path_is_reported() {
        let (dir, kernel) = test_project::with_goal_g();
        drop(kernel);
        let paths = crate::paths::ProjectPaths::at(dir.path());
        let mut watcher = ChangeWatcher::new(&paths, SchemaUpgrade::Refuse).unwrap();
        std::fs::rename(paths.db(), dir.path().join("aside.db")).unwrap();
        std::fs::write(paths.db(), "not a database\n".repeat(300)).unwrap();
        assert!(!watcher.wait(Some(Duration::from_millis(500))).unwrap());
        let err = watcher.wait(Some(Duration::from_secs(20))).unwrap_err();
        assert_eq!(err.exit_code(), 5, "{err}");
        assert_eq!(watcher.replacements(), 0);
    }

    /// `.loopx/` moved aside and a copy put back: the old directory's watch is gone, so the
    /// watcher finds the new directory by looking for it, reports the change and watches it.
    #[test]
    fn a_state_directory_moved_away_and_brought_back_is_watched_again() {
        let (dir, kernel) = test_project::with_goal_g();
        drop(kernel);
        let paths = crate::paths::ProjectPaths::at(dir.path());
        let mut watcher = ChangeWatcher::new(&paths, SchemaUpgrade::Refuse).unwrap();
        let aside = dir.path().join("state-aside");
        std::fs::rename(&paths.state, &aside).unwrap();
        assert!(!watcher.wait(Some(Duration::from_millis(600))).unwrap());
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&aside)
            .arg(&paths.state)
            .status()
            .unwrap();
        assert!(copied.success());
        assert!(watcher.wait(Some(Duration::from_secs(20))).unwrap());
        let mut kernel = Kernel::open(paths).unwrap();
        new_goal(&mut kernel, "after");
        assert!(watcher.wait(Some(Duration::from_secs(20))).unwrap());
    }

    #[test]
    fn an_idle_project_times_out() {
        let (dir, _kernel) = test_project::with_goal_g();
        let mut watcher = ChangeWatcher::new(
            &crate::paths::ProjectPaths::at(dir.path()),
            SchemaUpgrade::Refuse,
        )
        .unwrap();
        assert!(!watcher.wait(Some(Duration::from_millis(50))).unwrap());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn only_the_database_and_its_wal_are_database_files() {
        assert!(super::inotify::is_database_file(b"loopx.db"));
        assert!(super::inotify::is_database_file(b"loopx.db-wal"));
        assert!(!super::inotify::is_database_file(b"loopx.db-shm"));
        assert!(!super::inotify::is_database_file(b"registry.json"));
    }
}
