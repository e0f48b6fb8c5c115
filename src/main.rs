//! The `loopx` binary: the kernel commands run here; the commands that execute WebAssembly are
//! handed to `loopx-wasm` (see `loopx::cli::exec_wasm_host`), so this binary never links the
//! engine and starts in about the time of a plain process spawn.
//!
//! Its entry point is C's `main`, not Rust's. Rust's runtime start-up, which a Rust `main`
//! brings, sets up a stack-overflow report for the main thread: it reads `/proc/self/maps` to
//! find the stack's guard page and maps an alternate signal stack, a measurable share of each of
//! the core tick's five short processes (docs/benchmarks.md). `loopx` keeps what it relies on from
//! that start-up, done here before anything else: SIGPIPE ignored (a reader that went away is an
//! `EPIPE` on the write, which the commands report, not a silent kill), standard descriptors that
//! are closed opened on `/dev/null` (else the first file a command opens would take descriptor 1
//! and receive its output), and a panic still ending the process with exit 101 after the panic
//! hook has printed it. What is given up: a stack overflow ends the process with SIGSEGV instead
//! of Rust's one-line report before its abort (docs/decisions.md).
// The test harness brings its own `main` (`cargo test` builds this file as a test binary too).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
use std::ffi::{c_char, c_int};

#[cfg(not(test))]
#[unsafe(no_mangle)]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    ignore_sigpipe();
    if !open_closed_standard_descriptors() {
        // Nothing can be reported: stderr may be one of the closed descriptors.
        std::process::exit(6);
    }
    // Rust's standard library reads the arguments itself (`std::env::args_os`), on glibc from
    // the same values passed here.
    let code =
        std::panic::catch_unwind(|| loopx::cli::main(loopx::cli::exec_wasm_host)).unwrap_or(101);
    std::process::exit(code)
}

#[cfg(not(test))]
fn ignore_sigpipe() {
    // SAFETY: installs the constant disposition SIG_IGN; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Opens `/dev/null` on each of descriptors 0-2 that is closed, lowest first, so each takes the
/// closed number. `false` when one is closed and cannot be opened.
#[cfg(not(test))]
fn open_closed_standard_descriptors() -> bool {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    loop {
        // SAFETY: `fds` is a valid array of three `pollfd`s for the duration of the call.
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } >= 0 {
            break;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // A descriptor limit below 3 or no memory for the poll: ask each descriptor.
            _ => {
                for pfd in &mut fds {
                    // SAFETY: F_GETFD reads a flag of the descriptor; it changes nothing.
                    let closed = unsafe { libc::fcntl(pfd.fd, libc::F_GETFD) } == -1
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
                    pfd.revents = if closed { libc::POLLNVAL } else { 0 };
                }
                break;
            }
        }
    }
    fds.iter()
        .filter(|pfd| pfd.revents & libc::POLLNVAL != 0)
        // SAFETY: a NUL-terminated constant path; the descriptor is deliberately left open.
        .all(|_| unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) } >= 0)
}
