//! Captured, size-capped, sanitized plugin logs.
//!
//! Why this exists: guest stdout/stderr and `log` calls are the only way to see why a plugin failed
//! (a Rust panic reaches the host only as an `unreachable` trap), but they are hostile output. They
//! are kept in memory up to a byte cap (excess is dropped and counted, never an error for the guest),
//! and terminal escape sequences and other control characters are stripped before anyone prints them.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// Default cap on captured log bytes per call.
pub const DEFAULT_LOG_BYTES: usize = 64 * 1024;

/// One captured line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LogLine {
    /// `stdout`, `stderr`, or the `log-level` of a `log` call.
    pub stream: String,
    pub plugin: String,
    pub text: String,
}

#[derive(Debug, Default)]
struct Inner {
    lines: Vec<LogLine>,
    partial: Vec<(String, Vec<u8>)>,
    bytes: usize,
    dropped: usize,
}

/// Shared log buffer for one call (and the provider calls it makes).
#[derive(Debug, Clone)]
pub struct LogBuffer {
    inner: Arc<Mutex<Inner>>,
    cap: usize,
}

impl LogBuffer {
    pub fn new(cap: usize) -> LogBuffer {
        LogBuffer {
            inner: Arc::new(Mutex::new(Inner::default())),
            cap,
        }
    }

    /// Records a complete line from `plugin` on `stream`.
    pub fn line(&self, plugin: &str, stream: &str, text: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        push_line(&mut inner, self.cap, plugin, stream, text.as_bytes());
    }

    /// Appends raw stream bytes, splitting them into lines.
    fn bytes(&self, plugin: &str, stream: &str, bytes: &[u8]) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let key = format!("{plugin}\u{0}{stream}");
        let idx = match inner.partial.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                inner.partial.push((key, Vec::new()));
                inner.partial.len() - 1
            }
        };
        let mut pending = std::mem::take(&mut inner.partial[idx].1);
        for &b in bytes {
            if b == b'\n' {
                push_line(&mut inner, self.cap, plugin, stream, &pending);
                pending.clear();
            } else if pending.len() < 4096 {
                pending.push(b);
            }
        }
        inner.partial[idx].1 = pending;
    }

    /// Flushes unterminated partial lines and returns everything captured, plus a note when bytes
    /// were dropped at the cap.
    pub fn take(&self) -> Vec<LogLine> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let partial = std::mem::take(&mut inner.partial);
        for (key, rest) in partial {
            if !rest.is_empty() {
                let (plugin, stream) = key.split_once('\u{0}').unwrap_or((&key, ""));
                push_line(&mut inner, self.cap, plugin, stream, &rest);
            }
        }
        let mut lines = std::mem::take(&mut inner.lines);
        if inner.dropped > 0 {
            lines.push(LogLine {
                stream: "host".into(),
                plugin: String::new(),
                text: format!(
                    "log cap of {} bytes reached; {} bytes dropped",
                    self.cap, inner.dropped
                ),
            });
        }
        inner.bytes = 0;
        inner.dropped = 0;
        lines
    }

    /// A WASI stdout/stderr stream that feeds this buffer.
    pub(crate) fn stream(&self, plugin: &str, stream: &str) -> CapturedStream {
        CapturedStream {
            buf: self.clone(),
            plugin: plugin.to_string(),
            stream: stream.to_string(),
        }
    }
}

fn push_line(inner: &mut Inner, cap: usize, plugin: &str, stream: &str, raw: &[u8]) {
    let text = sanitize(&String::from_utf8_lossy(raw));
    if inner.bytes + text.len() > cap {
        inner.dropped += text.len();
        return;
    }
    inner.bytes += text.len();
    inner.lines.push(LogLine {
        stream: stream.to_string(),
        plugin: plugin.to_string(),
        text,
    });
}

/// Removes ANSI/VT escape sequences and control characters (except tab) from one line of plugin text.
pub fn sanitize(text: &str) -> String {
    strip(text, false)
}

/// Like [`sanitize`] but keeps newlines, for multi-line plugin output (observation bodies).
pub fn sanitize_multiline(text: &str) -> String {
    strip(text, true)
}

fn strip(text: &str, keep_newlines: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.peek() {
                // CSI: ESC [ params final-byte(0x40..=0x7e)
                Some('[') => {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC / DCS / APC / PM / SOS: ESC x ... terminated by BEL or ESC \
                Some(']') | Some('P') | Some('_') | Some('^') | Some('X') => {
                    chars.next();
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' && chars.peek() == Some(&'\\') {
                            chars.next();
                            break;
                        }
                    }
                }
                Some(_) => {
                    chars.next();
                }
                None => {}
            },
            '\t' => out.push(c),
            '\n' if keep_newlines => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// WASI output stream writing into a [`LogBuffer`]. Writes never fail: bytes past the cap are
/// counted and dropped, so a chatty plugin is truncated rather than crashed.
pub(crate) struct CapturedStream {
    buf: LogBuffer,
    plugin: String,
    stream: String,
}

impl IsTerminal for CapturedStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(CapturedStream {
            buf: self.buf.clone(),
            plugin: self.plugin.clone(),
            stream: self.stream.clone(),
        })
    }
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only WASIp3 uses the async form, and this host links WASIp2 only; p3 output is discarded.
        std::io::empty().async_stream()
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedStream {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedStream {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.buf.bytes(&self.plugin, &self.stream, &bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_escapes_and_controls() {
        assert_eq!(sanitize("\u{1b}[31mred\u{1b}[0m ok"), "red ok");
        assert_eq!(sanitize("a\u{1b}]0;title\u{7}b"), "ab");
        assert_eq!(sanitize("bell\u{7} cr\r tab\t"), "bell cr tab\t");
        assert_eq!(sanitize_multiline("one\ntwo\u{1b}[2J"), "one\ntwo");
    }

    #[test]
    fn caps_bytes_and_notes_the_drop() {
        let buf = LogBuffer::new(10);
        buf.line("p", "info", "12345");
        buf.line("p", "info", "67890");
        buf.line("p", "info", "dropped");
        let lines = buf.take();
        assert_eq!(lines.len(), 3);
        assert!(lines[2].text.contains("7 bytes dropped"));
    }
}
