//! `--watch` of `status` and `todo list`: print the command's output again after every commit by
//! any process, woken by [`crate::kernel::watch::ChangeWatcher`] (no re-reading on a timer).
//!
//! On a terminal each redraw clears the screen and homes the cursor, so the view stays in place;
//! into a pipe or a file each redraw is a plain block after a `--- <time>` line (text and
//! Markdown) or one compact JSON document per line (`--format json`), so a log or a script reads
//! successive states. It ends cleanly, exit 0, on SIGINT or SIGTERM and when stdout's reader has
//! gone.

use std::io::{IsTerminal, Write};
use std::os::fd::AsRawFd;
use std::time::Duration;

use super::Context;
use super::output::{Format, Output};
use crate::error::{LoopxError, Result, refused};
use crate::kernel::Kernel;
use crate::kernel::watch::ChangeWatcher;
use crate::turn::host::{install_stop_handlers, stop_requested};

/// How often the wait looks up from the watcher for a signal or a closed stdout.
const SLICE: Duration = Duration::from_millis(200);

/// Clear the screen, then home the cursor.
const CLEAR: &str = "\x1b[H\x1b[2J";

/// Prints `snapshot(kernel)` now and after every commit until a signal or a closed stdout. When
/// a restore puts another database at the path, `kernel` is reopened on it before the redraw.
pub fn run(
    ctx: &Context,
    kernel: &mut Kernel,
    mut snapshot: impl FnMut(&Kernel) -> Result<Output>,
) -> Result<Output> {
    if ctx.in_turn() {
        return Err(refused(
            "--watch runs until it is stopped, and a turn's request must end: run it outside the \
             turn",
        ));
    }
    install_stop_handlers();
    let mut watcher = ChangeWatcher::new(&ctx.paths()?, ctx.schema_upgrade)?;
    let mut replacements = watcher.replacements();
    let terminal = std::io::stdout().is_terminal();
    let mut redraws = 0u64;
    loop {
        if watcher.replacements() != replacements {
            kernel.reopen(ctx.schema_upgrade)?;
            replacements = watcher.replacements();
        }
        let frame = frame(&snapshot(kernel)?, ctx.format, terminal);
        if !write_frame(&frame)? {
            break;
        }
        redraws += 1;
        loop {
            if stop_requested() || stdout_closed() {
                return Ok(Output::streamed(redraws));
            }
            if watcher.wait(Some(SLICE))? {
                break;
            }
        }
    }
    Ok(Output::streamed(redraws))
}

/// One redraw as printed.
fn frame(output: &Output, format: Format, terminal: bool) -> String {
    match (format, terminal) {
        (Format::Json, _) => {
            let mut line = serde_json::to_string(&output.json_value()).expect("values serialize");
            line.push('\n');
            line
        }
        (_, true) => format!("{CLEAR}{}", output.render(format)),
        (_, false) => format!(
            "--- {}\n{}",
            crate::clock::rfc3339(crate::clock::now_ms()),
            output.render(format)
        ),
    }
}

/// Writes a redraw; false when stdout's reader has gone (the watch is over, not failed).
fn write_frame(text: &str) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(LoopxError::internal("writing the output", e)),
    }
}

/// Whether stdout's reader has gone (a pipe whose reader closed reports an error; a terminal
/// that hung up, a hang-up), checked without writing.
fn stdout_closed() -> bool {
    let mut pfd = libc::pollfd {
        fd: std::io::stdout().as_raw_fd(),
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call; a zero timeout never blocks.
    let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
    ready > 0 && pfd.revents & (libc::POLLERR | libc::POLLHUP) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames() {
        let out = Output::new(serde_json::json!({"n": 1})).heading("Title");
        assert_eq!(frame(&out, Format::Text, true), format!("{CLEAR}Title\n"));
        let plain = frame(&out, Format::Text, false);
        assert!(
            plain.starts_with("--- ") && plain.ends_with("\nTitle\n"),
            "{plain}"
        );
        let json = frame(&out, Format::Json, false);
        assert_eq!(json.lines().count(), 1, "{json}");
        assert!(
            json.contains("\"n\":1") && json.contains("\"ok\":true"),
            "{json}"
        );
    }
}
