//! Keeping the agent host out of `.loopx/` with the operating system, not with environment
//! variables.
//!
//! A host (and the validator) runs as the operator's own user, so file permissions cannot stop
//! it from opening `.loopx/loopx.db` and acting as the operator. On Linux the driver therefore
//! starts it in fresh user, mount and PID namespaces (unprivileged user namespaces suffice):
//!
//! 1. `unshare(USER | NS | PID)`, mapping the caller's uid and gid to themselves;
//! 2. a fork: the first child is PID 1 of the new PID namespace; the process the driver
//!    started stays outside and reports the host's wait status as its own;
//! 3. PID 1 makes every mount private, covers `.loopx/` with an empty read-only tmpfs
//!    (mode 000) and mounts a `/proc` that shows only the turn's own processes, so
//!    `/proc/<pid>/root` of a process outside cannot lead back to the real directory;
//! 4. a second fork runs the host, after one more `unshare(USER | NS)`: mounts inherited into a
//!    namespace owned by a less privileged user namespace are locked together, so the host,
//!    although it holds capabilities inside its own namespace, cannot unmount the cover to see
//!    what lies beneath.
//!
//! When the host exits, PID 1 exits with it and the kernel kills everything the host left in
//! the namespace, including processes that left its process group.
//!
//! The host still calls `loopx` during its turn: those calls travel over the agent channel
//! ([`super::channel`]), served by the driver and bound to the turn's lease.
//!
//! Every step after the first fork runs between `fork` and `exec`, where only async-signal-safe
//! calls are allowed: [`Sandbox`] prepares every byte it will write before the fork.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

use crate::error::{Result, bad_input, refused};
use crate::model::wire_enum;

wire_enum!(
    /// What `--isolation` asks for: `auto` isolates where the OS can and warns where it cannot,
    /// `required` refuses to start a turn the OS cannot isolate, `off` never isolates.
    #[derive(Default)]
    IsolationMode {
        #[default]
        Auto => "auto",
        Required => "required",
        Off => "off",
    }
);

wire_enum!(
    /// How a turn's host and validator actually ran (recorded in the journal).
    #[derive(Default)]
    Isolation {
        Namespace => "namespace",
        /// Also what journals written before isolation existed say: their hosts ran unisolated.
        #[default]
        None => "none",
    }
);

/// Everything the namespace set-up writes, prepared before the fork.
#[derive(Debug, Clone)]
pub struct Sandbox {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// The project's `.loopx/` directory, covered inside the namespace.
    cover: CString,
}

impl Sandbox {
    /// A sandbox that covers `state_dir` (the project's `.loopx/`).
    pub fn new(state_dir: &Path) -> Result<Sandbox> {
        // SAFETY: plain syscalls without arguments.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let cover = CString::new(state_dir.as_os_str().as_bytes()).map_err(|_| {
            bad_input(format!(
                "the project path {} contains a NUL byte",
                state_dir.display()
            ))
        })?;
        Ok(Sandbox {
            uid_map: format!("{uid} {uid} 1\n").into_bytes(),
            gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            cover,
        })
    }

    /// Enters the sandbox from a freshly forked child that is about to exec the host. Returns
    /// `Ok` only in the process that goes on to exec; the two processes it forks on the way
    /// never return (they wait and exit with the host's status).
    ///
    /// # Safety
    ///
    /// Call only between `fork` and `exec` (e.g. from `CommandExt::pre_exec`), in a process
    /// with no other threads: it forks, closes every descriptor in the waiting processes, and
    /// calls `_exit` in them.
    pub unsafe fn enter(&self) -> std::io::Result<()> {
        // SAFETY: the caller guarantees a single-threaded child between fork and exec; every
        // call below is a plain syscall on memory prepared before the fork.
        unsafe {
            check(libc::unshare(
                libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWPID,
            ))?;
            self.map_ids()?;
            let mut status_pipe = [0 as libc::c_int; 2];
            check(libc::pipe2(status_pipe.as_mut_ptr(), libc::O_CLOEXEC))?;
            let init = check(libc::fork())?;
            if init > 0 {
                relay_exit(init, status_pipe[0]);
            }
            // PID 1 of the new namespace.
            libc::close(status_pipe[0]);
            check(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            check(libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"loopx-turn".as_ptr(),
                self.cover.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"size=4k,nr_inodes=1,mode=000".as_ptr().cast(),
            ))?;
            check(libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            let host = check(libc::fork())?;
            if host > 0 {
                reap_until(host, status_pipe[1]);
            }
            // The host.
            libc::close(status_pipe[1]);
            check(libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ))?;
            // Locks the cover: see the module header.
            check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
            self.map_ids()?;
            Ok(())
        }
    }

    /// Maps the caller's uid and gid to themselves in the user namespace just created.
    unsafe fn map_ids(&self) -> std::io::Result<()> {
        // SAFETY: forwarded from `enter`.
        unsafe {
            // An unprivileged process may write a gid map only after denying setgroups. A
            // kernel without the file (before 3.19) has no such rule.
            let _ = write_file(c"/proc/self/setgroups", b"deny");
            write_file(c"/proc/self/uid_map", &self.uid_map)?;
            write_file(c"/proc/self/gid_map", &self.gid_map)
        }
    }
}

fn check<T: Copy + PartialOrd + Default>(rc: T) -> std::io::Result<T> {
    if rc < T::default() {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Whether the last syscall failed with `EINTR` (reads errno without allocating).
fn interrupted() -> bool {
    std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
}

/// Writes `bytes` to `path` with raw syscalls (no allocation).
unsafe fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: `path` is NUL-terminated and `bytes` valid for its length.
    unsafe {
        let fd = check(libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC))?;
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n == bytes.len() as isize {
            Ok(())
        } else {
            Err(err)
        }
    }
}

/// Closes every descriptor but `keep`, so the waiting processes hold none of the host's pipes
/// (nor the descriptor through which the spawning process learns that `exec` happened).
unsafe fn close_all_but(keep: libc::c_int) {
    // SAFETY: plain syscalls; closing descriptors this process no longer needs.
    unsafe {
        let max = libc::c_uint::MAX;
        if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0, (keep - 1) as libc::c_uint, 0);
        }
        if libc::syscall(libc::SYS_close_range, (keep + 1) as libc::c_uint, max, 0) != 0 {
            // Before Linux 5.9: close them one by one.
            for fd in 0..1024 {
                if fd != keep {
                    libc::close(fd);
                }
            }
        }
    }
}

/// The process the driver started: waits for PID 1 and leaves with the host's wait status, as
/// if it were the host, so the driver sees the host's exit code or signal.
unsafe fn relay_exit(init: libc::pid_t, status_read: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only; the process ends here.
    unsafe {
        close_all_but(status_read);
        // The driver signals its process group to stop a turn: the host, in the same group,
        // gets the signal itself; this process must stay to report how the host ended.
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        let mut init_status: libc::c_int = 0;
        while libc::waitpid(init, &mut init_status, 0) < 0 {
            if !interrupted() {
                libc::_exit(125);
            }
        }
        let mut host_status: libc::c_int = 0;
        let n = libc::read(
            status_read,
            (&mut host_status as *mut libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>(),
        );
        let status = if n == std::mem::size_of::<libc::c_int>() as isize {
            host_status
        } else {
            init_status
        };
        if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            libc::signal(sig, libc::SIG_DFL);
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, sig);
            libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            libc::kill(libc::getpid(), sig);
            libc::_exit(128 + sig);
        }
        libc::_exit(libc::WEXITSTATUS(status))
    }
}

/// PID 1: reaps every process of the namespace until the host exits, then hands the host's
/// wait status to [`relay_exit`] and exits, which kills whatever the host left behind.
unsafe fn reap_until(host: libc::pid_t, status_write: libc::c_int) -> ! {
    // SAFETY: async-signal-safe calls only; the process ends here.
    unsafe {
        close_all_but(status_write);
        loop {
            let mut status: libc::c_int = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == host {
                libc::write(
                    status_write,
                    (&status as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>(),
                );
                libc::_exit(0);
            }
            if pid < 0 && !interrupted() {
                libc::_exit(125);
            }
        }
    }
}

/// Whether this machine can isolate a host: the whole set-up is tried once in a throwaway child.
/// `Err` carries the reason, for the warning and for `required`.
///
/// The answer is kept for the process, and a success also in `.loopx/isolation.probe`, keyed by
/// the kernel's boot id and the user: whether namespaces work is a property of this boot for
/// this user, so later processes read one small file instead of forking three times. The file
/// lives where an isolated host cannot write, and only success is kept, so nothing can plant a
/// lasting "cannot isolate" to downgrade later turns; a failure is probed afresh each time.
pub fn available(state_dir: &Path) -> std::result::Result<(), String> {
    static PROBE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            let record = state_dir.join(PROBE_FILE);
            let key = probe_key();
            if let Some(key) = &key
                && crate::state_file::read_bounded_text(
                    &record,
                    crate::state_file::MAX_RECORD_BYTES,
                )
                .is_ok_and(|text| text.trim() == key)
            {
                return Ok(());
            }
            let result = probe(state_dir);
            if result.is_ok()
                && let Some(key) = key
            {
                // Best effort: without the record the next process probes again.
                let tmp = state_dir.join(format!("{PROBE_FILE}.{}", std::process::id()));
                let written = crate::state_file::create_fresh(&tmp)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, key.as_bytes()));
                if written.is_err() || std::fs::rename(&tmp, &record).is_err() {
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            result
        })
        .clone()
}

/// The file under `.loopx/` that records a successful probe.
pub const PROBE_FILE: &str = "isolation.probe";

/// What a recorded probe must match: this boot of the kernel and this user.
fn probe_key() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    // SAFETY: plain syscalls without arguments.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Some(format!(
        "namespaces ok: boot {} uid {uid} gid {gid}",
        boot.trim()
    ))
}

fn probe(state_dir: &Path) -> std::result::Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err("namespaces are a Linux feature".to_string());
    }
    let sandbox = Sandbox::new(state_dir).map_err(|e| e.to_string())?;
    let (mut err_pipe, errno_size) = ([0 as libc::c_int; 2], std::mem::size_of::<i32>());
    // SAFETY: the child runs only the async-signal-safe set-up and `_exit`; the parent reads
    // the child's errno from a pipe and reaps it.
    unsafe {
        if libc::pipe2(err_pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let pid = libc::fork();
        if pid == 0 {
            libc::close(err_pipe[0]);
            let code = match sandbox.enter() {
                Ok(()) => 0,
                Err(e) => {
                    let errno: i32 = e.raw_os_error().unwrap_or(0);
                    libc::write(err_pipe[1], (&errno as *const i32).cast(), errno_size);
                    1
                }
            };
            libc::_exit(code);
        }
        libc::close(err_pipe[1]);
        if pid < 0 {
            libc::close(err_pipe[0]);
            return Err(std::io::Error::last_os_error().to_string());
        }
        let mut errno: i32 = 0;
        let n = libc::read(err_pipe[0], (&mut errno as *mut i32).cast(), errno_size);
        libc::close(err_pipe[0]);
        let mut status = 0;
        while libc::waitpid(pid, &mut status, 0) < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        if n == errno_size as isize {
            return Err(format!(
                "creating user, mount and PID namespaces failed: {}",
                std::io::Error::from_raw_os_error(errno)
            ));
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(format!(
                "the namespace probe ended with wait status {status}"
            ));
        }
    }
    Ok(())
}

/// What a turn will run with under `mode`: the sandbox, or `None` with the warning to record.
/// `required` on a machine that cannot isolate is refused before anything is claimed.
pub fn resolve(mode: IsolationMode, state_dir: &Path) -> Result<(Option<Sandbox>, Option<String>)> {
    match mode {
        IsolationMode::Off => Ok((
            None,
            Some(
                "isolation: none (--isolation off): the host can read and write .loopx/ and act as the operator"
                    .to_string(),
            ),
        )),
        IsolationMode::Auto | IsolationMode::Required => match available(state_dir) {
            Ok(()) => Ok((Some(Sandbox::new(state_dir)?), None)),
            Err(why) if mode == IsolationMode::Required => Err(refused(format!(
                "--isolation required, but this machine cannot isolate the host ({why}); enable \
                 unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 or \
                 user.max_user_namespaces > 0), or run with --isolation auto to accept \
                 isolation: none"
            ))),
            Err(why) => Ok((
                None,
                Some(format!(
                    "isolation: none: the host runs with access to .loopx/ ({why}); \
                     --isolation required refuses instead"
                )),
            )),
        },
    }
}
