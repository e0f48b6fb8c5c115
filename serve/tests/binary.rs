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
    for listen in ["0.0.0.0:0", "[::]:0"] {
        let out = Command::new(server_bin())
            .arg("--root")
            .arg(dir.path())
            .args(["--listen", listen])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{listen}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("without a token") && err.contains("--token-file"),
            "{err}"
        );
    }
    let empty = dir.path().join("token");
    std::fs::write(&empty, "\n").unwrap();
    let out = Command::new(server_bin())
        .arg("--root")
        .arg(dir.path())
        .args(["--listen", "0.0.0.0:0", "--token-file"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("token is empty"));
    let out = Command::new(server_bin())
        .arg("--root")
        .arg(dir.path())
        .args(["--listen", "0.0.0.0:0", "--token-file"])
        .arg(dir.path().join("no-such-token"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-token"));
    let out = Command::new(server_bin())
        .arg("--root")
        .arg(dir.path())
        .args(["--listen", "nonsense"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
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
