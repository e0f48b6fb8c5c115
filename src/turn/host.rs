//! Running one host (or validator) process: argv without a shell, its own process group, a
//! wall-clock budget, capped output, and nothing left running afterwards.
//!
//! The child becomes the leader of a new process group (`setpgid(0, 0)`) and asks the kernel to
//! SIGKILL it if `loopx` dies (`PR_SET_PDEATHSIG`), so a `kill -9` of the driver does not leave a
//! host working on a lease nobody watches. When the host exits, the whole group is killed before
//! the exit is reaped (a pidfd, or `waitid(.., WNOWAIT)`, sees the exit), so a child that outlives the host
//! (`(sleep 60; touch marker) &`) dies with it and the group id cannot have been reused. On
//! timeout, or when `loopx` is asked to stop, the group gets SIGKILL (stop: SIGTERM first, then
//! SIGKILL after a short grace).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::isolation::Sandbox;

/// Set by the SIGINT/SIGTERM handler (see [`install_stop_handlers`]).
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Installs SIGINT/SIGTERM handlers that only set a flag: the driver then terminates the host's
/// process group, settles the turn in flight and stops.
pub fn install_stop_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_stop_signal as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        action.sa_flags = 0;
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
    }
}

/// Whether SIGINT/SIGTERM was received since the handlers were installed.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Test and library hook: request a stop as if a signal had arrived.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ProcessSpec<'a> {
    pub argv: &'a [String],
    pub cwd: &'a Path,
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    pub timeout: Duration,
    pub stdout_cap: usize,
    pub stderr_cap: usize,
    /// Run inside this sandbox (user, mount and PID namespaces without `.loopx/`).
    pub sandbox: Option<&'a Sandbox>,
}

/// What happened, as journaled in the `host_execute` phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessOutcome {
    /// Set when the process could not be started (missing program, permission, ...).
    pub spawn_error: Option<String>,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    /// The signal that ended the process, when one did.
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// `loopx` received SIGINT/SIGTERM and terminated the host.
    pub interrupted: bool,
    /// Captured stdout, at most the cap (lossily decoded when not UTF-8).
    pub stdout: String,
    /// Bytes the process wrote to stdout in total (may exceed the cap).
    pub stdout_bytes: usize,
    pub stdout_oversized: bool,
    pub stdout_utf8: bool,
    /// The last bytes of stderr (at most the cap).
    pub stderr_tail: String,
    pub elapsed_ms: u64,
}

impl ProcessOutcome {
    /// Exited by itself with status 0, in time.
    pub fn exited_ok(&self) -> bool {
        self.spawn_error.is_none()
            && self.exit_code == Some(0)
            && !self.timed_out
            && !self.interrupted
    }

    /// One line describing how the process ended.
    pub fn describe(&self) -> String {
        if let Some(e) = &self.spawn_error {
            return format!("could not start: {e}");
        }
        let how = if self.timed_out {
            format!(
                "timed out after {} ms; its process group was killed",
                self.elapsed_ms
            )
        } else if self.interrupted {
            "interrupted: loopx was asked to stop and terminated its process group".to_string()
        } else if let Some(s) = self.signal {
            format!("killed by signal {s}")
        } else {
            format!("exited with status {}", self.exit_code.unwrap_or(-1))
        };
        let tail = self.stderr_tail.trim();
        if tail.is_empty() || self.exit_code == Some(0) {
            how
        } else {
            let last: String = tail
                .lines()
                .last()
                .unwrap_or_default()
                .chars()
                .take(300)
                .collect();
            format!("{how}; stderr: {last}")
        }
    }
}

/// Captured output of one pipe: the first `cap` bytes (stdout) or a tail of about `cap` bytes
/// (stderr), and the total written. Always drained, so the writer never blocks on a full pipe.
struct Capture {
    bytes: Vec<u8>,
    total: usize,
    cap: usize,
    keep_head: bool,
}

impl Capture {
    fn new(cap: usize, keep_head: bool) -> Capture {
        Capture {
            bytes: Vec::new(),
            total: 0,
            cap,
            keep_head,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len();
        if self.keep_head {
            let room = self.cap.saturating_sub(self.bytes.len());
            self.bytes
                .extend_from_slice(&chunk[..room.min(chunk.len())]);
        } else {
            self.bytes.extend_from_slice(chunk);
            if self.bytes.len() > 2 * self.cap {
                let cut = self.bytes.len() - self.cap;
                self.bytes.drain(..cut);
            }
        }
    }
}

fn kill_group(pgid: i32, signal: i32) {
    // SAFETY: plain syscall; ESRCH (group already gone) is fine.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// A descriptor that becomes readable when `pid` exits (Linux ≥ 5.3), or `None`.
fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: the syscall returns a new descriptor we then own, or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd >= 0 {
            // SAFETY: `fd` is a fresh descriptor owned by nobody else.
            return Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
    }
    let _ = pid;
    None
}

/// Whether `pid` has exited, without reaping it (its pid, which is also the process group id,
/// cannot be reused before the group is killed).
fn exited_no_reap(pid: i32) -> bool {
    // SAFETY: siginfo_t is plain data; waitid fills it.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
        );
        rc == 0 && info.si_pid() != 0
    }
}

/// Reads what is available; returns false at end of file (or on a hard error).
fn read_some(pipe: &mut impl Read, into: &mut Capture) -> bool {
    let mut buf = [0u8; 16 * 1024];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return false,
            Ok(n) => into.push(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// Runs the process to completion (or until its budget ends) and reports what happened. Never
/// fails: a process that cannot be started is an outcome with `spawn_error`.
///
/// One thread multiplexes everything with `poll(2)`: the stdin bytes going in, stdout and stderr
/// coming out, and a pidfd that becomes readable when the host exits (without reaping it).
pub fn run_process(spec: &ProcessSpec) -> ProcessOutcome {
    let started = Instant::now();
    let mut out = ProcessOutcome::default();
    let Some(program) = spec.argv.first() else {
        out.spawn_error = Some("empty argv".to_string());
        return out;
    };
    let mut cmd = Command::new(program);
    cmd.args(&spec.argv[1..])
        .current_dir(spec.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("LOOPX_TEST_CRASH_AFTER");
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    // SAFETY: getpid is async-signal-safe; called before fork.
    let parent = unsafe { libc::getpid() };
    let sandbox = spec.sandbox.cloned();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(
                    libc::PR_SET_PDEATHSIG,
                    libc::SIGKILL as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The driver died between fork and prctl: do not start an unwatched host.
                if libc::getppid() != parent {
                    libc::_exit(137);
                }
            }
            if let Some(sandbox) = &sandbox {
                sandbox.enter()?;
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            out.spawn_error = Some(format!("{program}: {e}"));
            out.elapsed_ms = started.elapsed().as_millis() as u64;
            return out;
        }
    };
    let pid = child.id() as i32;
    out.pid = Some(child.id());
    let pidfd = pidfd_open(pid);

    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    for fd in [
        stdin.as_ref().map(|p| p.as_raw_fd()),
        stdout.as_ref().map(|p| p.as_raw_fd()),
        stderr.as_ref().map(|p| p.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    {
        set_nonblocking(fd);
    }
    let mut stdout_cap = Capture::new(spec.stdout_cap + 1, true);
    let mut stderr_cap = Capture::new(spec.stderr_cap, false);
    let mut stdin_off = 0usize;
    if spec.stdin.is_empty() {
        stdin = None;
    }

    let deadline = started + spec.timeout;
    let mut term_sent: Option<Instant> = None;
    // Set once the host has exited and its group was killed; pipes get a short grace after that.
    let mut exited_at: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if exited_at.is_none() {
            if now >= deadline {
                out.timed_out = true;
                kill_group(pid, libc::SIGKILL);
            } else if stop_requested() {
                match term_sent {
                    None => {
                        out.interrupted = true;
                        kill_group(pid, libc::SIGTERM);
                        term_sent = Some(now);
                    }
                    Some(t) if now.duration_since(t) > Duration::from_secs(2) => {
                        kill_group(pid, libc::SIGKILL);
                    }
                    Some(_) => {}
                }
            }
        }
        if let Some(t) = exited_at
            && (stdout.is_none() && stderr.is_none() || now.duration_since(t) > PIPE_GRACE)
        {
            break;
        }
        let mut fds: Vec<libc::pollfd> = Vec::with_capacity(4);
        let mut slots = [usize::MAX; 4];
        let mut add = |fd: RawFd, events: libc::c_short, slot: usize| {
            slots[slot] = fds.len();
            fds.push(libc::pollfd {
                fd,
                events,
                revents: 0,
            });
        };
        if let Some(p) = &stdin {
            add(p.as_raw_fd(), libc::POLLOUT, 0);
        }
        if let Some(p) = &stdout {
            add(p.as_raw_fd(), libc::POLLIN, 1);
        }
        if let Some(p) = &stderr {
            add(p.as_raw_fd(), libc::POLLIN, 2);
        }
        if exited_at.is_none()
            && let Some(fd) = &pidfd
        {
            add(fd.as_raw_fd(), libc::POLLIN, 3);
        }
        // Without a pidfd, exit is noticed by polling waitid every few milliseconds.
        let slice = if pidfd.is_some() {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(5)
        };
        let wait = if exited_at.is_some() {
            PIPE_GRACE.min(slice)
        } else {
            deadline.saturating_duration_since(now).min(slice)
        };
        // SAFETY: `fds` is a valid array of pollfd for the duration of the call.
        let rc = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().max(1) as libc::c_int,
            )
        };
        if rc < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            // Should not happen; fall back to a short sleep so the loop cannot spin.
            std::thread::sleep(Duration::from_millis(5));
        }
        let ready = |slot: usize| -> libc::c_short {
            match slots[slot] {
                usize::MAX => 0,
                i => fds[i].revents,
            }
        };
        if ready(0) != 0 {
            let done = match stdin.as_mut() {
                Some(p) => loop {
                    match p.write(&spec.stdin[stdin_off..]) {
                        Ok(n) => {
                            stdin_off += n;
                            if stdin_off >= spec.stdin.len() {
                                break true;
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                        // The host does not read stdin (or closed it): not an error.
                        Err(_) => break true,
                    }
                },
                None => true,
            };
            if done {
                stdin = None;
            }
        }
        if ready(1) != 0
            && let Some(p) = stdout.as_mut()
            && !read_some(p, &mut stdout_cap)
        {
            stdout = None;
        }
        if ready(2) != 0
            && let Some(p) = stderr.as_mut()
            && !read_some(p, &mut stderr_cap)
        {
            stderr = None;
        }
        if exited_at.is_none() && (ready(3) != 0 || (pidfd.is_none() && exited_no_reap(pid))) {
            // The host has exited (not yet reaped): kill whatever it left in its group.
            kill_group(pid, libc::SIGKILL);
            exited_at = Some(Instant::now());
            stdin = None;
        }
    }
    drop(stdin);
    match child.wait() {
        Ok(status) => {
            out.exit_code = status.code();
            out.signal = status.signal();
        }
        Err(e) => out.spawn_error = Some(format!("waiting for {program}: {e}")),
    }
    out.stdout_bytes = stdout_cap.total;
    out.stdout_oversized = stdout_cap.total > spec.stdout_cap;
    let kept = &stdout_cap.bytes[..stdout_cap.bytes.len().min(spec.stdout_cap)];
    match std::str::from_utf8(kept) {
        Ok(s) => {
            out.stdout = s.to_string();
            out.stdout_utf8 = true;
        }
        Err(_) => {
            out.stdout = String::from_utf8_lossy(kept).into_owned();
            out.stdout_utf8 = false;
        }
    }
    let start = stderr_cap.bytes.len().saturating_sub(spec.stderr_cap);
    out.stderr_tail = String::from_utf8_lossy(&stderr_cap.bytes[start..]).into_owned();
    out.elapsed_ms = started.elapsed().as_millis() as u64;
    out
}

/// How long pipes are drained after the host's group was killed: a process that escaped the group
/// (`setsid`) and kept a pipe open is not waited for beyond this.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// Kills every process of this user that carries `LOOPX_TURN_KEY=<turn_key>` in its environment:
/// what is left of a turn whose driver died (the host itself dies with the driver through
/// `PR_SET_PDEATHSIG`, but children it started would otherwise run on). Returns the pids killed.
/// Linux only (reads `/proc`); elsewhere it finds nothing.
pub fn kill_turn_processes(turn_key: &str) -> Vec<i32> {
    let needle = format!("LOOPX_TURN_KEY={turn_key}");
    let me = std::process::id() as i32;
    let mut killed = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return killed;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            // SAFETY: plain syscall on a pid we just identified.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed.push(pid);
            }
        }
    }
    killed
}
