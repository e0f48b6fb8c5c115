//! The agent channel: how a host calls `loopx` during its turn without reaching `.loopx/`.
//!
//! An isolated host cannot open the database ([`super::isolation`]), yet it must still add
//! todos, attach evidence and update the todo it leases. While the host (or validator) runs, the
//! driver serves a Unix socket in a private directory and names it in `LOOPX_AGENT_SOCKET`; the
//! `loopx` binary, finding that variable, sends its arguments over the socket instead of opening
//! the store. The driver runs the command as the turn's agent, with the turn's lease as proof,
//! whatever the request says about identity: the variable only says where the channel is, and the
//! authority comes from the socket the driver serves. Operator commands refuse an agent as
//! always, and commands that are not agent work (`init`, `turn`, `extension`, ...) are not served
//! at all. A host that drops or forges the variable falls back to opening `.loopx/`, which the
//! namespace has covered.
//!
//! What a request runs is up to the binary that embeds the driver: the CLI installs its handler
//! with [`install_handler`]; a library caller that installs none gives its hosts no channel.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{LoopxError, Result};
use crate::ids::new_ulid;
use crate::paths::ProjectPaths;

/// Names the socket for `loopx` processes inside a turn.
pub const SOCKET_ENV: &str = "LOOPX_AGENT_SOCKET";

/// Largest request or response accepted on the channel.
pub const MAX_MESSAGE_BYTES: u64 = 4 << 20;

/// How long the driver waits for a connected client to send its request. The client sets no
/// such bound on the answer: the command it asked for may wait on the store's write lock or run
/// long, and an answer given up on would still be committed after the client reported failure
/// (an agent retrying would then add its evidence twice). A driver that dies closes the socket,
/// and the turn's deadline ends the host, so the wait is bounded all the same.
const REQUEST_TIMEOUT: Duration = if cfg!(test) {
    Duration::from_millis(300)
} else {
    Duration::from_secs(10)
};

/// One `loopx` invocation from inside a turn: its arguments, without the program name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelRequest {
    pub argv: Vec<String>,
}

/// What the invocation printed and how it ended.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelResponse {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Who every request on a channel acts as: the turn's agent, holding the turn's lease.
#[derive(Debug, Clone)]
pub struct TurnIdentity {
    pub goal_id: String,
    pub agent_id: String,
    pub turn_key: String,
    pub claim_key: String,
    pub fence: i64,
}

/// A channel's private directory under `$TMPDIR` is `loopx-agent-<turn key>-<ULID>`.
const DIR_PREFIX: &str = "loopx-agent-";

/// Removes what a channel of `turn_key` left behind when its driver was killed (a dead socket in
/// a private directory); recovery calls it when it settles the turn.
pub fn remove_leftovers(turn_key: &str) {
    let prefix = format!("{DIR_PREFIX}{turn_key}-");
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Runs one request as `identity` on the project at `paths`.
pub type ChannelHandler = fn(&ProjectPaths, &TurnIdentity, &[String]) -> ChannelResponse;

static HANDLER: OnceLock<ChannelHandler> = OnceLock::new();

/// Sets what requests on every channel this process serves run (once; later calls are ignored).
pub fn install_handler(handler: ChannelHandler) {
    let _ = HANDLER.set(handler);
}

/// A channel being served; dropping it stops the server and removes the socket.
pub struct ChannelServer {
    dir: PathBuf,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ChannelServer {
    /// Starts serving `identity` on a fresh socket, or returns `None` when no handler is
    /// installed (a library caller's hosts then get no channel).
    pub fn start(paths: &ProjectPaths, identity: TurnIdentity) -> Result<Option<ChannelServer>> {
        let Some(handler) = HANDLER.get().copied() else {
            return Ok(None);
        };
        // A private directory (mode 0700) outside `.loopx/`, so the isolated host can reach the
        // socket and nobody else can create or replace it.
        let dir = std::env::temp_dir().join(format!(
            "{}{}-{}",
            DIR_PREFIX,
            identity.turn_key,
            new_ulid()
        ));
        std::fs::create_dir(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| LoopxError::internal(format!("creating {}", dir.display()), e))?;
        let socket = dir.join("agent.sock");
        let listener = UnixListener::bind(&socket).map_err(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            LoopxError::internal(
                format!("serving the agent channel at {}", socket.display()),
                e,
            )
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            let paths = paths.clone();
            std::thread::Builder::new()
                .name("loopx-agent-channel".to_string())
                .spawn(move || serve(listener, &stop, &paths, &identity, handler))
                .map_err(|e| LoopxError::internal("starting the agent channel", e))?
        };
        Ok(Some(ChannelServer {
            dir,
            socket,
            stop,
            thread: Some(thread),
        }))
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for ChannelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept; the server sees the flag and returns.
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(
    listener: UnixListener,
    stop: &AtomicBool,
    paths: &ProjectPaths,
    identity: &TurnIdentity,
    handler: ChannelHandler,
) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(mut conn) = conn else { continue };
        let response = match read_message::<ChannelRequest>(&mut conn, Some(REQUEST_TIMEOUT)) {
            Ok(req) => handler(paths, identity, &req.argv),
            Err(why) => ChannelResponse {
                code: 2,
                stdout: String::new(),
                stderr: format!("loopx: error: bad request on the agent channel: {why}\n"),
            },
        };
        let _ = write_message(&mut conn, &response);
    }
}

/// Reads one message, waiting at most `timeout` for each read (`None`: until the peer answers
/// or closes).
fn read_message<T: for<'de> Deserialize<'de>>(
    conn: &mut UnixStream,
    timeout: Option<Duration>,
) -> std::result::Result<T, String> {
    conn.set_read_timeout(timeout).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    conn.take(MAX_MESSAGE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_MESSAGE_BYTES {
        return Err(format!("larger than {MAX_MESSAGE_BYTES} bytes"));
    }
    serde_json::from_slice(&bytes).map_err(|e| e.to_string())
}

fn write_message<T: Serialize>(conn: &mut UnixStream, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    conn.write_all(&bytes)?;
    conn.shutdown(std::net::Shutdown::Write)
}

/// The client side: sends `argv` to the channel at `socket` and returns the response.
/// A channel that cannot be reached or closes without answering is an I/O failure (exit 6): the
/// request was not refused, the turn that served it is gone.
pub fn call(socket: &Path, argv: Vec<String>) -> Result<ChannelResponse> {
    let gone = |source: std::io::Error| LoopxError::Io {
        path: socket.to_path_buf(),
        context: format!(
            "the agent channel at {} is not answering: {SOCKET_ENV} is set only for processes \
             of a running turn, and the channel closes when the turn's host exits",
            socket.display()
        ),
        source,
    };
    let mut conn = UnixStream::connect(socket).map_err(gone)?;
    write_message(&mut conn, &ChannelRequest { argv }).map_err(gone)?;
    read_message(&mut conn, None).map_err(|why| gone(std::io::Error::other(why)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn echo(_: &ProjectPaths, who: &TurnIdentity, argv: &[String]) -> ChannelResponse {
        if argv == ["slow"] {
            std::thread::sleep(REQUEST_TIMEOUT * 3);
        }
        ChannelResponse {
            code: 0,
            stdout: format!("{} {}", who.agent_id, argv.join(" ")),
            stderr: String::new(),
        }
    }

    /// Whatever a process inside the turn sends, the driver answers with a refusal or the
    /// command's result, keeps serving, and removes its socket when the turn ends.
    #[test]
    fn garbage_and_oversized_requests_are_refused_and_the_channel_keeps_serving() {
        install_handler(echo);
        let dir = tempfile::tempdir().unwrap();
        let identity = TurnIdentity {
            goal_id: "g".into(),
            agent_id: "a1".into(),
            turn_key: "turn-x".into(),
            claim_key: "k".into(),
            fence: 1,
        };
        let server = ChannelServer::start(&ProjectPaths::at(dir.path()), identity)
            .unwrap()
            .expect("a handler is installed");
        let send = |bytes: &[u8]| -> Result<ChannelResponse, String> {
            let mut conn = UnixStream::connect(server.socket()).unwrap();
            // The server stops reading at its limit, answers and closes: a sender still writing
            // then sees its connection reset instead of the answer.
            let _ = conn.write_all(bytes);
            let _ = conn.shutdown(std::net::Shutdown::Write);
            read_message(&mut conn, None)
        };
        let junk = send(b"\x1b]0;pwned\x07 not json").unwrap();
        assert_eq!(junk.code, 2, "{junk:?}");
        assert!(junk.stderr.contains("bad request"), "{junk:?}");
        let unknown = send(br#"{"argv":["status"],"agent":"operator"}"#).unwrap();
        assert_eq!(unknown.code, 2, "an unknown field is refused: {unknown:?}");
        if let Ok(huge) = send(&vec![b'a'; (MAX_MESSAGE_BYTES + 10) as usize]) {
            assert_eq!(huge.code, 2, "{huge:?}");
        }
        let ok = call(server.socket(), vec!["status".into()]).unwrap();
        assert_eq!((ok.code, ok.stdout.as_str()), (0, "a1 status"));
        // A command that takes longer than the driver gives a request to arrive (one waiting on
        // the store's write lock) is answered, not reported failed while it goes on to commit.
        let slow = call(server.socket(), vec!["slow".into()]).unwrap();
        assert_eq!((slow.code, slow.stdout.as_str()), (0, "a1 slow"));
        let socket = server.socket().to_path_buf();
        drop(server);
        assert!(!socket.exists(), "the socket is removed when the turn ends");
        let gone = call(&socket, vec!["status".into()]).unwrap_err();
        assert_eq!(gone.exit_code(), 6, "{gone}");
    }
}
