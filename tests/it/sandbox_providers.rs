//! Provider permissions: a provider sees exactly the directories and env vars the operator granted,
//! read-only unless write was granted. Escapes via `..`, symlinks and absolute paths, ungranted env
//! vars and writes to read-only grants are refused; the database is unchanged in every case.

use std::path::PathBuf;

use crate::support::plugin::{Sandbox, extension, fifo_released_after, wasm};
use loopx::plugin::ObserveRequest;
use loopx::plugin::invoke::{InvokeError, call_provider};

/// A project with a `granted/` directory (holding `ok.txt` and a symlink `link` to `../secret.txt`)
/// and the probe provider installed as `probe/p` with `grants`.
fn setup(permissions: &[&str], grants: &[&str]) -> (Sandbox, PathBuf) {
    setup_with_limits(permissions, grants, "")
}

/// [`setup`] with `[provides.limits]` set to `limits`.
fn setup_with_limits(permissions: &[&str], grants: &[&str], limits: &str) -> (Sandbox, PathBuf) {
    let mut p = Sandbox::new();
    let root = p.dir.path().to_path_buf();
    let granted = root.join("granted");
    std::fs::create_dir_all(&granted).unwrap();
    std::fs::write(granted.join("ok.txt"), "visible").unwrap();
    std::fs::write(root.join("secret.txt"), "TOP-SECRET").unwrap();
    std::os::unix::fs::symlink(root.join("secret.txt"), granted.join("link")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", granted.join("rel-link")).unwrap();
    let dir = extension(
        &root,
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        permissions,
        "",
        limits,
    );
    let grants: Vec<String> = grants
        .iter()
        .map(|g| g.replace("$GRANTED", &granted.display().to_string()))
        .collect();
    let grants: Vec<&str> = grants.iter().map(String::as_str).collect();
    p.install(&dir, &grants).unwrap();
    (p, granted)
}

fn req(op: &str, target: &str) -> ObserveRequest {
    ObserveRequest {
        operation: op.into(),
        target: target.into(),
        params: Default::default(),
    }
}

fn refused(p: &mut Sandbox, op: &str, target: &str) -> InvokeError {
    let before = p.fingerprint();
    let err = call_provider(&mut p.kernel, &p.host, "probe/p", &req(op, target))
        .expect_err(&format!("{op} {target} must be refused"));
    let msg = err.error.to_string();
    assert!(
        msg.contains("probe/p"),
        "error does not name the plugin: {msg}"
    );
    assert!(!msg.contains("TOP-SECRET"), "secret leaked: {msg}");
    assert_eq!(p.fingerprint(), before);
    err
}

#[test]
fn reads_inside_the_grant_work() {
    let (mut p, _) = setup(&["fs.read:data"], &["fs.read:data=$GRANTED"]);
    let (obs, _) = call_provider(
        &mut p.kernel,
        &p.host,
        "probe/p",
        &req("read", "/data/ok.txt"),
    )
    .unwrap();
    assert_eq!(obs.body, "visible");
    assert_eq!(obs.source, "probe/p");
}

#[test]
fn dotdot_escape_is_refused() {
    let (mut p, _) = setup(&["fs.read:data"], &["fs.read:data=$GRANTED"]);
    refused(&mut p, "read", "/data/../secret.txt");
    refused(&mut p, "read", "/data/../../../../etc/passwd");
}

#[test]
fn symlink_escape_is_refused() {
    let (mut p, _) = setup(&["fs.read:data"], &["fs.read:data=$GRANTED"]);
    refused(&mut p, "read", "/data/link");
    refused(&mut p, "read", "/data/rel-link");
}

#[test]
fn absolute_paths_outside_the_grant_are_refused() {
    let (mut p, _) = setup(&["fs.read:data"], &["fs.read:data=$GRANTED"]);
    refused(&mut p, "read", "/etc/passwd");
    refused(&mut p, "list", "/");
}

#[test]
fn ungranted_env_var_is_invisible() {
    // SAFETY: set before any thread of this test reads the environment; the name is unique to it.
    unsafe { std::env::set_var("LOOPX_TEST_PROVIDER_SECRET", "TOP-SECRET") };
    let (mut p, _) = setup(&["fs.read:data"], &["fs.read:data=$GRANTED"]);
    let err = refused(&mut p, "env", "LOOPX_TEST_PROVIDER_SECRET");
    assert_eq!(err.plugin_kind.map(|k| k.as_str()), Some("guest_error"));
    refused(&mut p, "env", "HOME");
    refused(&mut p, "env", "PATH");
}

#[test]
fn granted_env_var_is_visible() {
    // SAFETY: as above, a name unique to this test.
    unsafe { std::env::set_var("LOOPX_TEST_PROVIDER_GRANTED", "granted-value") };
    let (mut p, _) = setup(
        &["fs.read:data", "env:LOOPX_TEST_PROVIDER_GRANTED"],
        &["fs.read:data=$GRANTED", "env:LOOPX_TEST_PROVIDER_GRANTED"],
    );
    let (obs, _) = call_provider(
        &mut p.kernel,
        &p.host,
        "probe/p",
        &req("env", "LOOPX_TEST_PROVIDER_GRANTED"),
    )
    .unwrap();
    assert_eq!(obs.body, "granted-value");
    refused(&mut p, "env", "HOME");
}

#[test]
fn write_to_a_read_only_grant_is_refused() {
    let (mut p, granted) = setup(&["fs.read:data"], &["fs.read:data=$GRANTED"]);
    refused(&mut p, "write", "/data/new.txt");
    refused(&mut p, "write", "/data/ok.txt");
    assert!(
        !granted.join("new.txt").exists(),
        "a read-only grant was written to"
    );
    assert_eq!(
        std::fs::read_to_string(granted.join("ok.txt")).unwrap(),
        "visible"
    );
}

#[test]
fn write_grant_allows_writes_inside_only() {
    let (mut p, granted) = setup(&["fs.write:data"], &["fs.write:data=$GRANTED"]);
    call_provider(
        &mut p.kernel,
        &p.host,
        "probe/p",
        &req("write", "/data/new.txt"),
    )
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(granted.join("new.txt")).unwrap(),
        "written by probe"
    );
    refused(&mut p, "write", "/data/../escaped.txt");
    assert!(!p.dir.path().join("escaped.txt").exists());
}

#[test]
fn sleeping_provider_returns_by_its_deadline() {
    let (mut p, _) = setup_with_limits(
        &["fs.read:data"],
        &["fs.read:data=$GRANTED"],
        "deadline_ms = 300",
    );
    let (obs, _) = call_provider(&mut p.kernel, &p.host, "probe/p", &req("sleep", "20")).unwrap();
    assert_eq!(obs.summary, "slept 20 ms");
    let started = std::time::Instant::now();
    let err = refused(&mut p, "sleep", "60000");
    assert_eq!(
        err.plugin_kind.map(|k| k.as_str()),
        Some("deadline"),
        "{}",
        err.error
    );
    assert!(
        started.elapsed().as_secs() < 10,
        "the provider held the host for {:?}",
        started.elapsed()
    );
}

#[test]
fn provider_blocked_in_a_read_returns_by_its_deadline() {
    let (mut p, granted) = setup_with_limits(
        &["fs.read:data"],
        &["fs.read:data=$GRANTED"],
        "deadline_ms = 300",
    );
    fifo_released_after(&granted.join("fifo"), std::time::Duration::from_secs(10));
    let started = std::time::Instant::now();
    let err = refused(&mut p, "read", "/data/fifo");
    assert_eq!(
        err.plugin_kind.map(|k| k.as_str()),
        Some("deadline"),
        "{}",
        err.error
    );
    assert!(
        started.elapsed() < std::time::Duration::from_millis(300 + 700),
        "the provider held the host for {:?}",
        started.elapsed()
    );
}
