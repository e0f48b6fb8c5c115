//! The `loopx-serve` executable: what it refuses to start with, and the live event stream a
//! commit by another process's kernel wakes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopx::kernel::goal::NewGoal;
use loopx::kernel::{Actor, Kernel};
use support::{loopx_bin, server_bin, skip};

mod support;

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    Kernel::init(dir.path()).unwrap().unwrap();
    dir
}

/// Kills the server when the test ends, however it ends.
struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    let mut child = Command::new(server_bin())
        .arg("--root")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    Server(child, addr)
}

#[test]
fn a_non_loopback_address_without_a_token_is_refused_with_exit_2() {
    let dir = project();
    let empty = dir.path().join("token");
    std::fs::write(&empty, "\n").unwrap();
    let root = dir.path().as_os_str();
    let cases: &[(&[&std::ffi::OsStr], i32, &str)] = &[
        (
            &["--listen".as_ref(), "0.0.0.0:0".as_ref()],
            2,
            "without a token",
        ),
        (&["--listen".as_ref(), "[::]:0".as_ref()], 2, "--token-file"),
        (
            &["--token-file".as_ref(), empty.as_os_str()],
            2,
            "token is empty",
        ),
        (
            &[
                "--token-file".as_ref(),
                "/nonexistent/no-such-token".as_ref(),
            ],
            3,
            "no-such-token",
        ),
        // A file without end is read only as far as a token line could go.
        (
            &["--token-file".as_ref(), "/dev/zero".as_ref()],
            2,
            "no line break",
        ),
        // A token file the machine will not read (here a directory) is an I/O failure naming it.
        (
            &["--token-file".as_ref(), root],
            6,
            &dir.path().display().to_string(),
        ),
        // A token that could never be presented is refused.
        (&["--token".as_ref(), "a;b".as_ref()], 2, "cannot send back"),
        (&["--listen".as_ref(), "nonsense".as_ref()], 2, "nonsense"),
    ];
    for (args, code, says) in cases {
        let mut command = Command::new(server_bin());
        command.arg("--root").arg(root);
        if !args.contains(&std::ffi::OsStr::new("--listen")) {
            command.args(["--listen", "0.0.0.0:0"]);
        }
        let out = command.args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// `loopx --format json serve` reports a failure to start as every other command does: the JSON
/// envelope on stdout, with the exit code and kind a script branches on.
#[test]
fn a_refused_start_under_format_json_prints_the_error_envelope() {
    let dir = project();
    for (listen, code, kind) in [("nonsense", 2, "bad_input"), ("0.0.0.0:0", 2, "bad_input")] {
        let out = Command::new(loopx_bin())
            .args(["--format", "json", "serve", "--listen", listen])
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{listen}");
        let envelope: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{listen}: stdout is not JSON ({e}): {out:?}"));
        assert_eq!(envelope["ok"], false, "{envelope}");
        assert_eq!(envelope["error"]["kind"], kind, "{envelope}");
        assert_eq!(envelope["error"]["exit_code"], code, "{envelope}");
        assert!(!out.stderr.is_empty());
    }
}

#[test]
fn the_default_address_is_loopback() {
    let out = Command::new(server_bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[default: 127.0.0.1:7878]"), "{help}");
}

#[test]
fn a_commit_from_another_kernel_reaches_an_open_event_stream() {
    let dir = project();
    let server = start(dir.path(), &[]);
    let mut stream = TcpStream::connect(&server.1).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    write!(
        stream,
        "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n\r\n",
        server.1
    )
    .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let mut read_until = |seen: &mut String, stream: &mut TcpStream, want: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !seen.contains(want) && Instant::now() < deadline {
            let n = stream.read(&mut buf).unwrap();
            assert!(n > 0, "the stream ended: {seen}");
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert!(seen.contains(want), "no {want:?} in {seen}");
    };
    read_until(&mut seen, &mut stream, "event: ready");
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(seen.contains("content-type: text/event-stream"), "{seen}");
    let mut kernel = Kernel::open(loopx::paths::ProjectPaths::at(dir.path())).unwrap();
    kernel
        .create_goal(
            &Actor::Operator,
            NewGoal {
                id: Some("live".into()),
                title: "Live".into(),
                ..NewGoal::default()
            },
        )
        .unwrap();
    read_until(&mut seen, &mut stream, "event: change");
}

#[test]
fn loopx_serve_without_its_executable_beside_it_names_the_fix() {
    let loopx = loopx_bin();
    if !loopx.is_file() {
        return skip(
            "loopx-bin",
            "target/*/loopx is not built beside loopx-serve (`cargo test -p loopx-serve` alone \
             does not build it; `cargo build` does)",
        );
    }
    let dir = project();
    let lone = tempfile::tempdir().unwrap();
    let copy = lone.path().join("loopx");
    std::fs::copy(&loopx, &copy).unwrap();
    let out = Command::new(&copy)
        .arg("--root")
        .arg(dir.path())
        .arg("serve")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("loopx-serve") && err.contains("cargo build"),
        "{err}"
    );
}

/// Reads `stream` until the server closes it, for at most `limit`; what it sent, or a panic
/// naming `what` if it is still open.
fn read_until_closed(stream: &mut TcpStream, limit: Duration, what: &str) -> String {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("{what}: still open after {limit:?} ({e})"),
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

/// A whole request on a new connection is answered (200) and the connection closed.
fn assert_serves_a_whole_request(host: &str) {
    let mut normal = TcpStream::connect(host).unwrap();
    write!(
        normal,
        "GET /api/v1/goals HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let answer = read_until_closed(&mut normal, Duration::from_secs(20), "normal");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[test]
fn a_client_that_never_finishes_a_request_is_disconnected_and_others_are_served() {
    let dir = project();
    let server = start(dir.path(), &[]);
    let host = server.1.clone();
    let started = Instant::now();
    let mut partial = TcpStream::connect(&host).unwrap();
    partial.write_all(b"GET / HTTP/1.1\r\nX-a: ").unwrap();
    let mut silent = TcpStream::connect(&host).unwrap();
    // A kept-alive connection left idle after one answer.
    let mut idle = TcpStream::connect(&host).unwrap();
    write!(idle, "GET /api/v1/status HTTP/1.1\r\nHost: {host}\r\n\r\n").unwrap();
    // An event stream is a response being written: no header clock runs while it lasts.
    let mut events = TcpStream::connect(&host).unwrap();
    write!(
        events,
        "GET /api/v1/events HTTP/1.1\r\nHost: {host}\r\n\r\n"
    )
    .unwrap();
    // While they wait, a whole request is answered.
    assert_serves_a_whole_request(&host);

    let limit = Duration::from_secs(20);
    assert_eq!(read_until_closed(&mut partial, limit, "partial header"), "");
    assert_eq!(read_until_closed(&mut silent, limit, "silent"), "");
    let answered = read_until_closed(&mut idle, limit, "idle keep-alive");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    // The header clock (5 s) closed them, not the reads' own limit.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );

    // The event stream outlived the header clock and still carries changes.
    events
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut kernel = Kernel::open(loopx::paths::ProjectPaths::at(dir.path())).unwrap();
    kernel
        .create_goal(
            &Actor::Operator,
            NewGoal {
                id: Some("late".into()),
                title: "Late".into(),
                ..NewGoal::default()
            },
        )
        .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !seen.contains("event: change") && Instant::now() < deadline {
        let n = events.read(&mut buf).unwrap();
        assert!(n > 0, "the event stream ended: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    assert!(seen.contains("event: change"), "{seen}");
}

#[test]
fn an_interrupt_still_stops_the_server_cleanly() {
    let dir = project();
    let mut server = start(dir.path(), &[]);
    // An open connection that sent nothing does not hold the shutdown up, nor does an open
    // page's event stream, which never ends by itself.
    let _quiet = TcpStream::connect(&server.1).unwrap();
    let mut events = TcpStream::connect(&server.1).unwrap();
    write!(
        events,
        "GET /api/v1/events HTTP/1.1\r\nHost: {}\r\n\r\n",
        server.1
    )
    .unwrap();
    let mut first = [0u8; 64];
    events
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert!(events.read(&mut first).unwrap() > 0, "the stream started");
    let status = Command::new("kill")
        .args(["-INT", &server.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = server.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "still running after an interrupt"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "{exit:?}");
}

/// How many sockets the server process holds (its listener and its connections; the database
/// files a request opens are not counted).
fn open_sockets(server: &Server) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", server.0.id()))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("socket:"))
        .count()
}

/// A client that pipelines requests and never reads the answers is disconnected once the server
/// has waited [`loopx_serve::WRITE_STALL_TIMEOUT`] for it to take more: it cannot hold one of
/// the server's connections (and descriptors) by never reading.
#[test]
fn a_client_that_stops_reading_its_answers_is_disconnected() {
    let dir = project();
    let server = start(dir.path(), &[]);
    let host = server.1.clone();
    let idle = open_sockets(&server);
    let mut hog = TcpStream::connect(&host).unwrap();
    // Far more answer bytes than the socket buffers on both sides hold (the OpenAPI document
    // is tens of KB); the writes stop once the server stops reading requests.
    hog.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let request = format!("GET /api/v1/openapi.json HTTP/1.1\r\nHost: {host}\r\n\r\n");
    for _ in 0..5_000 {
        if hog.write_all(request.as_bytes()).is_err() {
            break;
        }
    }
    let connected = Instant::now();
    while open_sockets(&server) == idle {
        assert!(
            connected.elapsed() < Duration::from_secs(10),
            "the server never took the connection"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let limit = loopx_serve::WRITE_STALL_TIMEOUT + Duration::from_secs(15);
    while open_sockets(&server) > idle {
        assert!(
            connected.elapsed() < limit,
            "the server still holds the connection of a client that stopped reading"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(hog);
    // The server serves others as before.
    assert_serves_a_whole_request(&host);
}

/// A request without the token is answered once and its connection closed: a client without the
/// token cannot keep a connection open by pipelining refused requests into it.
#[test]
fn a_refused_request_closes_its_connection() {
    let dir = project();
    let server = start(dir.path(), &["--token", "secret-token"]);
    let host = server.1.clone();
    let mut stranger = TcpStream::connect(&host).unwrap();
    let request = format!("GET /api/v1/status HTTP/1.1\r\nHost: {host}\r\n\r\n");
    write!(stranger, "{request}{request}{request}").unwrap();
    let answered = read_until_closed(&mut stranger, Duration::from_secs(3), "refused");
    assert!(answered.starts_with("HTTP/1.1 401"), "{answered}");
    assert_eq!(answered.matches("HTTP/1.1 ").count(), 1, "{answered}");
    assert!(
        answered.to_ascii_lowercase().contains("connection: close"),
        "{answered}"
    );
}
