//! Install-time refusals, tamper detection and the extension lifecycle. A refused install records
//! nothing and leaves no files; a tampered component never loads.

mod plugin_support;

use loopx::plugin::invoke::invoke_capability;
use loopx::plugin::registry::{remove, rollback, set_enabled};
use loopx::plugin::{InstallMode, PluginError};
use plugin_support::{Project, extension, wasm};

fn assert_refused_install(
    p: &mut Project,
    dir: &std::path::Path,
    grants: &[&str],
    needles: &[&str],
) -> loopx::LoopxError {
    let before = p.fingerprint();
    let err = p.install(dir, grants).expect_err("install must be refused");
    let msg = err.to_string();
    for n in needles {
        assert!(msg.contains(n), "'{n}' missing from: {msg}");
    }
    assert_eq!(
        p.fingerprint(),
        before,
        "a refused install changed the database"
    );
    let ext_dir = p.paths().extensions_dir();
    let leftovers: Vec<_> = std::fs::read_dir(&ext_dir)
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(
        leftovers.is_empty(),
        "a refused install left files: {leftovers:?}"
    );
    err
}

#[test]
fn provider_importing_sockets_fails_to_install() {
    let mut p = Project::new();
    let dir = extension(
        p.dir.path(),
        "net",
        "provider",
        "n",
        &wasm("net-provider"),
        &[],
        "",
        "",
    );
    let err = assert_refused_install(&mut p, &dir, &[], &["net/n", "wasi:sockets", "not granted"]);
    assert_eq!(err.exit_code(), 1);
}

#[test]
fn provider_using_the_filesystem_without_a_grant_fails_to_install() {
    let mut p = Project::new();
    let dir = extension(
        p.dir.path(),
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        &["fs.read:data"],
        "",
        "",
    );
    assert_refused_install(
        &mut p,
        &dir,
        &[],
        &["probe/p", "wasi:filesystem", "no fs.read"],
    );
}

#[test]
fn capability_importing_the_filesystem_fails_to_install() {
    let mut p = Project::new();
    let dir = extension(
        p.dir.path(),
        "fscap",
        "capability",
        "c",
        &wasm("fs-cap"),
        &[],
        "",
        "",
    );
    assert_refused_install(
        &mut p,
        &dir,
        &[],
        &[
            "fscap/c",
            "wasi:filesystem",
            "capabilities have no filesystem authority",
        ],
    );
}

#[test]
fn provider_component_declared_as_capability_fails_to_install() {
    let mut p = Project::new();
    let dir = extension(
        p.dir.path(),
        "wrong",
        "capability",
        "c",
        &wasm("fs-observe"),
        &[],
        "",
        "",
    );
    assert_refused_install(&mut p, &dir, &[], &["wrong/c", "not granted"]);
}

#[test]
fn grant_that_was_not_declared_is_bad_input() {
    let mut p = Project::new();
    let data = p.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let dir = extension(
        p.dir.path(),
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        &["fs.read:data"],
        "",
        "",
    );
    let err = assert_refused_install(
        &mut p,
        &dir,
        &[&format!("fs.write:data={}", data.display())],
        &["does not declare"],
    );
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn incompatible_api_range_is_refused() {
    let mut p = Project::new();
    let dir = extension(
        p.dir.path(),
        "old",
        "capability",
        "c",
        &wasm("hostile-cap"),
        &[],
        "",
        "",
    );
    let text = std::fs::read_to_string(dir.join("extension.toml"))
        .unwrap()
        .replace(">=0.1, <0.2", ">=0.2, <0.3");
    std::fs::write(dir.join("extension.toml"), text).unwrap();
    let err = assert_refused_install(&mut p, &dir, &[], &["old", "0.1.0"]);
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn tampered_component_fails_to_load() {
    let mut p = Project::new();
    p.goal("g1");
    let dir = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "",
        "",
    );
    let report = p.install(&dir, &[]).unwrap();
    let installed = std::path::Path::new(&report.install_dir).join("cap.wasm");
    let mut bytes = std::fs::read(&installed).unwrap();
    let n = bytes.len();
    bytes[n - 10] ^= 0xff;
    std::fs::write(&installed, bytes).unwrap();
    let before = p.fingerprint();
    let err = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        false,
    )
    .unwrap_err();
    assert_eq!(err.plugin_kind, Some("tampered"));
    let msg = err.error.to_string();
    assert!(
        msg.contains("hostile/cap") && msg.contains("sha256"),
        "{msg}"
    );
    assert_eq!(err.error.exit_code(), 5);
    assert_eq!(p.fingerprint(), before);
}

#[test]
fn tampered_compiled_artifact_fails_to_load() {
    let mut p = Project::new();
    p.goal("g1");
    let dir = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "",
        "",
    );
    let report = p.install(&dir, &[]).unwrap();
    let artifact = p.host.cache().artifact_path(&report.components[0].sha256);
    let mut bytes = std::fs::read(&artifact).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&artifact, bytes).unwrap();
    let before = p.fingerprint();
    let err = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        false,
    )
    .unwrap_err();
    assert_eq!(err.plugin_kind, Some("tampered"), "{}", err.error);
    assert_eq!(p.fingerprint(), before);
}

#[test]
fn lifecycle_install_disable_upgrade_rollback_remove() {
    let mut p = Project::new();
    p.goal("g1");
    let dir = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "",
        "",
    );
    let r1 = p.install(&dir, &[]).unwrap();
    assert_eq!(r1.revision, 1);
    assert!(
        r1.components[0]
            .imports
            .iter()
            .any(|i| i.starts_with("loopx:plugin/host@0.1"))
    );
    // Installing again is a conflict: upgrades are explicit.
    assert_eq!(p.install(&dir, &[]).unwrap_err().exit_code(), 4);

    set_enabled(&mut p.kernel, "hostile", false).unwrap();
    let err = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        true,
    )
    .unwrap_err();
    assert_eq!(err.plugin_kind, Some("disabled"));
    set_enabled(&mut p.kernel, "hostile", true).unwrap();

    let r2 = p
        .host
        .install(&mut p.kernel, &dir, &[], &dir, InstallMode::Upgrade)
        .unwrap();
    assert_eq!((r2.revision, r2.previous_revision), (2, Some(1)));
    assert!(
        !r2.components[0].compiled,
        "the cache should already hold the artifact"
    );

    let back = rollback(&mut p.kernel, "hostile").unwrap();
    assert_eq!(back.revision, 1);
    invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        false,
    )
    .unwrap();
    assert_eq!(
        rollback(&mut p.kernel, "hostile").unwrap_err().exit_code(),
        1
    );

    let goal_state = p.state_fingerprint();
    remove(&mut p.kernel, &p.host, "hostile").unwrap();
    assert!(!p.paths().extensions_dir().join("hostile").exists());
    assert_eq!(
        p.state_fingerprint(),
        goal_state,
        "removal must leave goal state intact"
    );
    let err = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        true,
    )
    .unwrap_err();
    assert_eq!(err.error.exit_code(), 3);
}

#[test]
fn plugin_error_kinds_are_distinct() {
    let e = PluginError::Deadline {
        plugin: "x/y".into(),
        limit_ms: 5,
    };
    assert_eq!(e.kind(), "deadline");
    assert!(e.to_string().contains("x/y") && e.to_string().contains("5 ms"));
}
