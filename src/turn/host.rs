//! Running one host (or validator) process: argv without a shell, its own process group, a
//! wall-clock budget, capped output, and nothing left running afterwards.
//!
//! The child becomes the leader of a new process group (`setpgid(0, 0)`) and asks the kernel to
//! SIGKILL it if `loopx` dies (`PR_SET_PDEATHSIG`), so a `kill -9` of the driver does not leave a
//! host working on a lease nobody watches. When the host exits, the whole group is killed before
//! the exit is reaped (the waiter uses `waitid(.., WNOWAIT)`), so a child that outlives the host
//! (`(sleep 60; touch marker) &`) dies with it and the group id cannot have been reused. On
//! timeout, or when `loopx` is asked to stop, the group gets SIGKILL (stop: SIGTERM first, then
//! SIGKILL after a short grace).

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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

#[derive(Default)]
struct Capture {
    bytes: Vec<u8>,
    total: usize,
}

/// Reads `pipe` to the end. `keep_head`: keep the first `cap` bytes (stdout); otherwise keep a
/// tail of about `cap` bytes (stderr). Always drains, so the writer never blocks on a full pipe.
fn drain(mut pipe: impl Read, cap: usize, keep_head: bool, into: Arc<Mutex<Capture>>) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut c = into.lock().expect("capture lock");
        c.total += n;
        if keep_head {
            let room = cap.saturating_sub(c.bytes.len());
            let take = room.min(n);
            c.bytes.extend_from_slice(&buf[..take]);
        } else {
            c.bytes.extend_from_slice(&buf[..n]);
            if c.bytes.len() > 2 * cap {
                let cut = c.bytes.len() - cap;
                c.bytes.drain(..cut);
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

/// Blocks until `pid` has exited, without reaping it (so its pid, which is also the process group
/// id, cannot be reused before the group is killed).
fn wait_exit_no_reap(pid: i32) {
    loop {
        // SAFETY: siginfo_t is plain data; waitid fills it.
        let rc = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            return;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Runs the process to completion (or until its budget ends) and reports what happened. Never
/// fails: a process that cannot be started is an outcome with `spawn_error`.
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

    let stdout_cap = Arc::new(Mutex::new(Capture::default()));
    let stderr_cap = Arc::new(Mutex::new(Capture::default()));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut readers = Vec::new();
    if let Some(p) = child.stdout.take() {
        let (c, cap, tx) = (stdout_cap.clone(), spec.stdout_cap + 1, done_tx.clone());
        readers.push(std::thread::spawn(move || {
            drain(p, cap, true, c);
            let _ = tx.send(());
        }));
    }
    if let Some(p) = child.stderr.take() {
        let (c, cap, tx) = (stderr_cap.clone(), spec.stderr_cap, done_tx.clone());
        readers.push(std::thread::spawn(move || {
            drain(p, cap, false, c);
            let _ = tx.send(());
        }));
    }
    drop(done_tx);
    if let Some(mut stdin) = child.stdin.take() {
        let bytes = spec.stdin.clone();
        std::thread::spawn(move || {
            // The host may not read stdin at all; a broken pipe is not an error.
            let _ = stdin.write_all(&bytes);
        });
    }
    let (exit_tx, exit_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        wait_exit_no_reap(pid);
        let _ = exit_tx.send(());
    });

    let deadline = started + spec.timeout;
    let mut term_sent: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now >= deadline {
            out.timed_out = true;
            kill_group(pid, libc::SIGKILL);
            let _ = exit_rx.recv();
            break;
        }
        if stop_requested() {
            match term_sent {
                None => {
                    out.interrupted = true;
                    kill_group(pid, libc::SIGTERM);
                    term_sent = Some(now);
                }
                Some(t) if now.duration_since(t) > Duration::from_secs(2) => {
                    kill_group(pid, libc::SIGKILL);
                    let _ = exit_rx.recv();
                    break;
                }
                Some(_) => {}
            }
        }
        let slice = (deadline - now).min(Duration::from_millis(50));
        match exit_rx.recv_timeout(slice) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
    // The host has exited (not yet reaped): kill whatever it left in its group, then reap.
    kill_group(pid, libc::SIGKILL);
    match child.wait() {
        Ok(status) => {
            out.exit_code = status.code();
            out.signal = status.signal();
        }
        Err(e) => out.spawn_error = Some(format!("waiting for {program}: {e}")),
    }
    // Pipes close once every group member is gone; a process that escaped the group (setsid)
    // and kept a pipe open is not waited for beyond a short grace.
    let grace = Instant::now() + Duration::from_secs(2);
    for _ in 0..readers.len() {
        let left = grace.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            break;
        }
    }
    {
        let c = stdout_cap.lock().expect("capture lock");
        out.stdout_bytes = c.total;
        out.stdout_oversized = c.total > spec.stdout_cap;
        let kept = &c.bytes[..c.bytes.len().min(spec.stdout_cap)];
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
    }
    {
        let c = stderr_cap.lock().expect("capture lock");
        let start = c.bytes.len().saturating_sub(spec.stderr_cap);
        out.stderr_tail = String::from_utf8_lossy(&c.bytes[start..]).into_owned();
    }
    out.elapsed_ms = started.elapsed().as_millis() as u64;
    out
}

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
