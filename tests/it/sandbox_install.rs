//! Install-time refusals, tamper detection and the extension lifecycle. A refused install records
//! nothing and leaves no files; a tampered component never loads.

use crate::support::plugin::{Sandbox, extension, wasm};
use loopx::plugin::invoke::invoke_capability;
use loopx::plugin::registry::{remove, rollback, set_enabled};
use loopx::plugin::{InstallMode, PluginError};

fn assert_refused_install(
    p: &mut Sandbox,
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
    assert_eq!(
        artifacts(p),
        Vec::<String>::new(),
        "a refused install left compiled artifacts"
    );
    err
}

/// [`assert_refused_install`] for a refusal the import audit makes: it must cost no compile.
fn assert_refused_before_compile(
    p: &mut Sandbox,
    dir: &std::path::Path,
    grants: &[&str],
    needles: &[&str],
) -> loopx::LoopxError {
    let compiles = p.host.cache().compiles();
    let err = assert_refused_install(p, dir, grants, needles);
    assert_eq!(
        p.host.cache().compiles(),
        compiles,
        "the import audit ran after a compile: {err}"
    );
    err
}

/// The `.cwasm` files in the project's component cache.
fn artifacts(p: &Sandbox) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(p.paths().component_cache_dir())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".cwasm"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Runs the real `loopx` binary in `dir`.
fn loopx(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_loopx"))
        .current_dir(dir)
        .args(args)
        .env_remove("LOOPX_ROOT")
        .env_remove("LOOPX_AGENT_ID")
        .env_remove("LOOPX_TURN_KEY")
        .env_remove("LOOPX_CLAIM_KEY")
        .output()
        .unwrap()
}

/// A project with hostile-cap installed as `hostile/cap` and issue-fix as `issue-fix/issue-fix`,
/// both capabilities, so one's artifact can stand in for the other's.
fn two_capabilities() -> (Sandbox, String, String) {
    let mut p = Sandbox::new();
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
    let hostile = p.install(&dir, &[]).unwrap().components[0].sha256.clone();
    wasm("issue-fix");
    let other = p
        .install(
            &crate::support::plugin::repo().join("extensions/issue-fix"),
            &[],
        )
        .unwrap()
        .components[0]
        .sha256
        .clone();
    (p, hostile, other)
}

#[test]
fn provider_importing_sockets_fails_to_install() {
    let mut p = Sandbox::new();
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
    let err =
        assert_refused_before_compile(&mut p, &dir, &[], &["net/n", "wasi:sockets", "not granted"]);
    assert_eq!(err.exit_code(), 1);
}

#[test]
fn provider_using_the_filesystem_without_a_grant_fails_to_install() {
    let mut p = Sandbox::new();
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
    assert_refused_before_compile(
        &mut p,
        &dir,
        &[],
        &["probe/p", "wasi:filesystem", "no fs.read"],
    );
}

#[test]
fn capability_importing_the_filesystem_fails_to_install() {
    let mut p = Sandbox::new();
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
    assert_refused_before_compile(
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
    let mut p = Sandbox::new();
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
    assert_refused_before_compile(&mut p, &dir, &[], &["wrong/c", "not granted"]);
}

#[test]
fn grant_that_was_not_declared_is_bad_input() {
    let mut p = Sandbox::new();
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
    let mut p = Sandbox::new();
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
    let mut p = Sandbox::new();
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
    assert_eq!(err.plugin_kind.map(|k| k.as_str()), Some("tampered"));
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
    let mut p = Sandbox::new();
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
    assert_eq!(
        err.plugin_kind.map(|k| k.as_str()),
        Some("tampered"),
        "{}",
        err.error
    );
    assert_eq!(p.fingerprint(), before);
}

#[test]
fn lifecycle_install_disable_upgrade_rollback_remove() {
    let mut p = Sandbox::new();
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
    assert_eq!(err.plugin_kind.map(|k| k.as_str()), Some("disabled"));
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
    assert_eq!(e.kind().as_str(), "deadline");
    assert!(e.to_string().contains("x/y") && e.to_string().contains("5 ms"));
}

#[test]
fn planted_artifact_is_never_reused_by_install() {
    // Compile issue-fix in this project, then plant its artifact (with a matching sidecar digest,
    // which was all the old cache checked) under the name hostile-cap's artifact will have.
    let mut p = Sandbox::new();
    p.goal("g1");
    wasm("issue-fix");
    let other = p
        .install(
            &crate::support::plugin::repo().join("extensions/issue-fix"),
            &[],
        )
        .unwrap();
    let other_artifact = p.host.cache().artifact_path(&other.components[0].sha256);
    let hostile_wasm = std::fs::read(wasm("hostile-cap")).unwrap();
    let hostile_sha = loopx::plugin::cache::sha256_hex(&hostile_wasm);
    let planted = p.host.cache().artifact_path(&hostile_sha);
    std::fs::copy(&other_artifact, &planted).unwrap();
    let planted_bytes = std::fs::read(&planted).unwrap();
    std::fs::write(
        planted.with_extension("cwasm.sha256"),
        loopx::plugin::cache::sha256_hex(&planted_bytes),
    )
    .unwrap();

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
    assert!(
        report.components[0].compiled,
        "install reused an artifact it did not produce"
    );
    assert_ne!(std::fs::read(&planted).unwrap(), planted_bytes);
    // And what runs is hostile-cap's own code.
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        true,
    )
    .unwrap();
    assert_eq!(
        serde_json::to_value(&out.proposals).unwrap()[0]["reason"],
        "nothing to do"
    );
}

#[test]
fn swapped_artifact_is_refused_and_doctor_reports_it() {
    let (mut p, hostile, other) = two_capabilities();
    let target = p.host.cache().artifact_path(&hostile);
    let source = p.host.cache().artifact_path(&other);
    // The swap an attacker (or a provider with write access to the cache) would make: the other
    // component's artifact, and its sidecar, under this component's name.
    std::fs::copy(&source, &target).unwrap();
    let _ = std::fs::copy(
        source.with_extension("cwasm.sha256"),
        target.with_extension("cwasm.sha256"),
    );
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
    assert_eq!(
        err.plugin_kind.map(|k| k.as_str()),
        Some("tampered"),
        "{}",
        err.error
    );
    assert_eq!(err.error.exit_code(), 5);
    let name = target.file_name().unwrap().to_string_lossy().into_owned();
    assert!(err.error.to_string().contains(&name), "{}", err.error);
    assert_eq!(
        p.fingerprint(),
        before,
        "a refused load changed the database"
    );

    let doctor = loopx(p.dir.path(), &["doctor"]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&doctor.stdout),
        String::from_utf8_lossy(&doctor.stderr)
    );
    assert_eq!(doctor.status.code(), Some(5), "{text}");
    assert!(
        text.contains(&name),
        "doctor did not name the artifact: {text}"
    );

    // The other extension is untouched and still loads.
    p.host
        .load_named(
            &mut p.kernel,
            "issue-fix/issue-fix",
            loopx::plugin::Kind::Capability,
        )
        .map_err(|e| e.error.to_string())
        .unwrap();
}

#[test]
fn doctor_verifies_every_artifact_and_component() {
    let (p, hostile, _) = two_capabilities();
    let healthy = loopx(p.dir.path(), &["--format", "json", "doctor"]);
    let text = String::from_utf8_lossy(&healthy.stdout).into_owned();
    assert_eq!(healthy.status.code(), Some(0), "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let checks: Vec<String> = json["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["check"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        checks.iter().filter(|c| c.starts_with("artifact ")).count(),
        2,
        "{checks:?}"
    );
    assert!(
        checks.contains(&"component hostile/cap".to_string()),
        "{checks:?}"
    );
    assert!(
        checks.contains(&"component issue-fix/issue-fix".to_string()),
        "{checks:?}"
    );

    // A flipped byte in an artifact is damage doctor names.
    let artifact = p.host.cache().artifact_path(&hostile);
    let mut bytes = std::fs::read(&artifact).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&artifact, bytes).unwrap();
    let damaged = loopx(p.dir.path(), &["doctor"]);
    let text = String::from_utf8_lossy(&damaged.stderr).into_owned();
    assert_eq!(damaged.status.code(), Some(5), "{text}");
    assert!(
        text.contains(&artifact.file_name().unwrap().to_string_lossy().into_owned()),
        "{text}"
    );
}

#[test]
fn deleted_artifact_is_recompiled_from_the_verified_component_and_recorded() {
    let (mut p, hostile, _) = two_capabilities();
    let artifact = p.host.cache().artifact_path(&hostile);
    let installed = std::fs::read(&artifact).unwrap();
    std::fs::remove_file(&artifact).unwrap();
    invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        None,
        "ok".into(),
        true,
    )
    .unwrap();
    let bytes = std::fs::read(&artifact).expect("the load recompiled the artifact");
    let key = p.host.cache().engine_key().to_string();
    let record = p
        .kernel
        .component_artifact(&hostile, &key)
        .unwrap()
        .expect("recorded");
    assert_eq!(
        record.artifact_sha256,
        loopx::plugin::cache::sha256_hex(&bytes)
    );
    // Compilation is deterministic: two processes recompiling the same component at once write
    // and record the same digest, so neither can make the other's record wrong.
    assert_eq!(bytes, installed, "a recompile produced different bytes");
}

/// The probe provider, declaring `fs.read:data` and `fs.write:data`, ready to install.
fn probe_provider_reading_data(p: &Sandbox) -> std::path::PathBuf {
    extension(
        p.dir.path(),
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        &["fs.read:data", "fs.write:data"],
        "",
        "",
    )
}

#[test]
fn grants_of_directories_holding_or_inside_loopx_state_are_refused() {
    let mut p = Sandbox::new();
    let dir = probe_provider_reading_data(&p);
    let root = p.dir.path().to_path_buf();
    let cache = p.paths().component_cache_dir();
    std::fs::create_dir_all(&cache).unwrap();
    let link = root.join("innocent");
    std::os::unix::fs::symlink(p.paths().state, &link).unwrap();
    for grant in [
        format!("fs.read:data={}", root.display()),
        format!("fs.write:data={}", cache.display()),
        format!("fs.read:data={}", p.paths().state.display()),
        format!("fs.write:data={}", link.display()),
    ] {
        let err = assert_refused_install(&mut p, &dir, &[&grant], &[".loopx", "grant a directory"]);
        assert_eq!(err.exit_code(), 2, "{grant}: {err}");
        let name = grant.split('=').next().unwrap();
        assert!(err.to_string().contains(name), "{err}");
    }
    // A sibling directory of `.loopx/` is fine.
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    p.install(&dir, &[&format!("fs.read:data={}", data.display())])
        .unwrap();
}

#[test]
fn grants_of_kernel_filesystems_are_refused() {
    // procfs would hand a provider this process's environment and memory map through
    // /proc/self; sysfs and the device tree expose kernel state and devices.
    let mut p = Sandbox::new();
    let dir = probe_provider_reading_data(&p);
    let link = p.dir.path().join("innocent-proc");
    std::os::unix::fs::symlink("/proc/self", &link).unwrap();
    for (grant, what) in [
        ("fs.read:data=/proc".to_string(), "procfs"),
        ("fs.write:data=/proc/self".to_string(), "procfs"),
        (format!("fs.read:data={}", link.display()), "procfs"),
        ("fs.read:data=/sys".to_string(), "sysfs"),
        ("fs.read:data=/dev".to_string(), "/dev"),
    ] {
        let err = assert_refused_install(&mut p, &dir, &[&grant], &[what, "grant an ordinary"]);
        assert_eq!(err.exit_code(), 2, "{grant}: {err}");
    }
}
