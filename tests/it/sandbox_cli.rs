//! The plugin commands end to end through the real `loopx` binary: `extension new` → build →
//! `extension install` → `capability invoke` (dry run, then for real), `provider call`, the
//! extension lifecycle, and a sandbox failure's exit code and message.

use std::process::Command;

use crate::support::Project;
use crate::support::plugin::{extension, repo, wasm};
use serde_json::Value;

fn todo_list(p: &Project, goal: &str) -> Value {
    p.json(&["todo", "list", "--goal-id", goal])
}

#[test]
fn first_party_extensions_through_the_cli() {
    wasm("fs-observe");
    wasm("issue-fix");
    let p = Project::new();
    let d = p.path();
    let ws = d.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(
        ws.join("test-results.txt"),
        "test a::b ... FAILED\ntest a::c ... ok\n",
    )
    .unwrap();
    let fs_dir = repo().join("extensions/fs-observe");
    let grant = format!("fs.read:workspace={}", ws.display());
    let installed = p
        .run(&[
            "--format",
            "json",
            "extension",
            "install",
            fs_dir.to_str().unwrap(),
            "--grant",
            &grant,
        ])
        .ok()
        .json();
    assert_eq!(installed["install"]["revision"], 1);
    p.run(&[
        "extension",
        "install",
        repo().join("extensions/issue-fix").to_str().unwrap(),
    ])
    .ok();
    let list = p
        .run(&["--format", "json", "extension", "list"])
        .ok()
        .json();
    assert_eq!(list["extensions"].as_array().unwrap().len(), 2);
    let inspect = p.run(&["extension", "inspect", "fs-observe"]).ok();
    assert!(
        inspect.stdout.contains("fs.read:workspace="),
        "{}",
        inspect.stdout
    );

    // Provider call.
    std::fs::write(
        d.join("req.json"),
        r#"{"operation": "test-results", "target": "test-results.txt"}"#,
    )
    .unwrap();
    let obs = p
        .run(&[
            "--format",
            "json",
            "provider",
            "call",
            "fs-observe/fs",
            "--input",
            "req.json",
        ])
        .ok()
        .json();
    assert_eq!(obs["observation"]["kind"], "test-results");
    assert_eq!(obs["observation"]["source"], "fs-observe/fs");

    // Capability invoke: dry run writes nothing, then for real.
    p.run(&["goal", "create", "--id", "g1", "--title", "Fix the tests"])
        .ok();
    std::fs::write(d.join("fix.txt"), "issue = a::b fails\n").unwrap();
    // An input file that is not there is exit 3, as every missing thing is.
    let r = p.run(&[
        "capability",
        "invoke",
        "issue-fix/issue-fix",
        "--goal-id",
        "g1",
        "--input",
        "no-such-input.txt",
    ]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(r.stderr.contains("no-such-input.txt"), "{}", r.stderr);
    let before = todo_list(&p, "g1");
    let dry = p
        .run(&[
            "--format",
            "json",
            "capability",
            "invoke",
            "issue-fix/issue-fix",
            "--goal-id",
            "g1",
            "--input",
            "fix.txt",
            "--dry-run",
        ])
        .ok()
        .json();
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["admission"]["refused"], 0);
    assert_eq!(todo_list(&p, "g1"), before, "a dry run wrote todos");
    let text = p
        .run(&[
            "capability",
            "invoke",
            "issue-fix/issue-fix",
            "--goal-id",
            "g1",
            "--input",
            "fix.txt",
        ])
        .ok();
    assert!(text.stdout.contains("accepted"), "{}", text.stdout);
    let todos = todo_list(&p, "g1");
    assert_eq!(todos["todos"].as_array().map(Vec::len), Some(4), "{todos}");

    // Lifecycle.
    p.run(&["extension", "disable", "issue-fix"]).ok();
    let disabled = p.run(&[
        "capability",
        "invoke",
        "issue-fix/issue-fix",
        "--goal-id",
        "g1",
        "--input",
        "fix.txt",
    ]);
    assert_eq!(disabled.code, 1, "{}", disabled.stderr);
    assert!(disabled.stderr.contains("disabled"), "{}", disabled.stderr);
    // A name the disabled extension does not provide is reported as such: enabling would not help.
    let unknown = p.run(&[
        "capability",
        "invoke",
        "issue-fix/no-such",
        "--goal-id",
        "g1",
        "--input",
        "fix.txt",
    ]);
    assert_eq!(unknown.code, 3, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("provides no capability 'no-such'")
            && !unknown.stderr.contains("disabled"),
        "{}",
        unknown.stderr
    );
    p.run(&["extension", "enable", "issue-fix"]).ok();
    let up = p
        .run(&[
            "--format",
            "json",
            "extension",
            "upgrade",
            fs_dir.to_str().unwrap(),
        ])
        .ok()
        .json();
    assert_eq!(up["install"]["revision"], 2);
    assert_eq!(
        up["install"]["grants"][0].as_str().unwrap(),
        grant.replace(
            ws.to_str().unwrap(),
            ws.canonicalize().unwrap().to_str().unwrap()
        )
    );
    p.run(&["extension", "rollback", "fs-observe"]).ok();

    // A goal bound to a capability needs it installed and enabled: should-run says repair_required
    // while it is disabled or removed, and runs again once it is back.
    p.run(&[
        "todo",
        "add",
        "--goal-id",
        "g1",
        "--id",
        "bound",
        "--title",
        "needs issue-fix",
        "--capability",
        "issue-fix/issue-fix",
    ])
    .ok();
    let route = || {
        p.run(&["--format", "json", "quota", "should-run", "--goal-id", "g1"])
            .ok()
            .json()["route"]
            .clone()
    };
    assert_ne!(route(), "repair_required", "installed and enabled");
    p.run(&["extension", "disable", "issue-fix"]).ok();
    assert_eq!(route(), "repair_required");
    p.run(&["extension", "enable", "issue-fix"]).ok();
    assert_ne!(route(), "repair_required");
    let todos = todo_list(&p, "g1");
    p.run(&["extension", "remove", "issue-fix"]).ok();
    assert_eq!(todo_list(&p, "g1"), todos, "removal changed goal state");
    let after = p
        .run(&["--format", "json", "quota", "should-run", "--goal-id", "g1"])
        .ok()
        .json();
    assert_eq!(after["route"], "repair_required", "{after}");
    assert_eq!(
        after["interaction_contract"]["agent_channel"]["missing_capabilities"][0],
        "issue-fix/issue-fix"
    );
    let gone = p.run(&[
        "capability",
        "invoke",
        "issue-fix/issue-fix",
        "--goal-id",
        "g1",
        "--input",
        "fix.txt",
    ]);
    assert_eq!(gone.code, 3, "{}", gone.stderr);
}

#[test]
fn sandbox_failure_exit_code_and_message() {
    let p = Project::new();
    let d = p.path();
    let ext = extension(
        d,
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "",
        "fuel = 3_000_000",
    );
    p.run(&["extension", "install", ext.to_str().unwrap()]).ok();
    p.run(&["goal", "create", "--id", "g1", "--title", "Hostile"])
        .ok();
    std::fs::write(d.join("loop.txt"), "log 1\nloop\n").unwrap();
    let before = todo_list(&p, "g1");
    let out = p.run(&[
        "--format",
        "json",
        "capability",
        "invoke",
        "hostile/cap",
        "--goal-id",
        "g1",
        "--input",
        "loop.txt",
    ]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let err = out.json();
    assert_eq!(err["ok"], false);
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("hostile/cap") && msg.contains("3000000"),
        "{msg}"
    );
    // The limit that stopped the guest is a field, not only words in the message.
    assert_eq!(err["error"]["plugin_failure"], "fuel_exhausted", "{err}");
    assert!(
        out.stderr.contains("[hostile/cap info] line 0"),
        "plugin log not shown: {}",
        out.stderr
    );
    assert!(
        !out.stderr.contains('\u{1b}'),
        "escape sequence reached the terminal"
    );
    assert_eq!(todo_list(&p, "g1"), before);
    // Ungranted imports refuse install with exit 1 and name the import.
    let net = extension(
        d,
        "net",
        "provider",
        "n",
        &wasm("net-provider"),
        &[],
        "",
        "",
    );
    let refused = p.run(&[
        "--format",
        "json",
        "extension",
        "install",
        net.to_str().unwrap(),
    ]);
    assert_eq!(refused.code, 1);
    assert_eq!(
        refused.json()["error"]["plugin_failure"],
        "import_not_granted",
        "{}",
        refused.stdout
    );
    assert!(
        refused.stderr.contains("wasi:sockets"),
        "{}",
        refused.stderr
    );
}

#[test]
fn scaffolded_capability_builds_installs_and_runs() {
    let p = Project::new();
    let d = p.path();
    p.run(&["extension", "new", "todo-lines", "--kind", "capability"])
        .ok();
    let crate_dir = d.join("todo-lines");
    // Shared target dir under the repo so repeated runs reuse the wit-bindgen build.
    let target = repo().join("target").join("scaffold-test");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&crate_dir)
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
            target.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "the scaffold does not build");
    // The manifest points at ./target; copy the artifact there as a default build would put it.
    let built = target.join("wasm32-wasip2/release/todo_lines.wasm");
    let expected = crate_dir.join("target/wasm32-wasip2/release");
    std::fs::create_dir_all(&expected).unwrap();
    std::fs::copy(&built, expected.join("todo_lines.wasm")).unwrap();
    p.run(&["extension", "install", "todo-lines"]).ok();
    p.run(&["goal", "create", "--id", "g1", "--title", "Scaffold"])
        .ok();
    std::fs::write(d.join("lines.txt"), "write the parser\nadd tests\n").unwrap();
    let out = p
        .run(&[
            "--format",
            "json",
            "capability",
            "invoke",
            "todo-lines/todo-lines",
            "--goal-id",
            "g1",
            "--input",
            "lines.txt",
        ])
        .ok()
        .json();
    assert_eq!(out["admission"]["accepted"], 2, "{out}");
    assert_eq!(
        todo_list(&p, "g1")["todos"].as_array().map(Vec::len),
        Some(2)
    );

    // Provider scaffold builds too and reads only its grant.
    p.run(&["extension", "new", "read-file", "--kind", "provider"])
        .ok();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(d.join("read-file"))
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "--target-dir",
            target.to_str().unwrap(),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "the provider scaffold does not build");
    let expected = d.join("read-file/target/wasm32-wasip2/release");
    std::fs::create_dir_all(&expected).unwrap();
    std::fs::copy(
        target.join("wasm32-wasip2/release/read_file.wasm"),
        expected.join("read_file.wasm"),
    )
    .unwrap();
    std::fs::create_dir_all(d.join("data")).unwrap();
    std::fs::write(d.join("data/notes.txt"), "hello").unwrap();
    p.run(&[
        "extension",
        "install",
        "read-file",
        "--grant",
        "fs.read:workspace=data",
    ])
    .ok();
    std::fs::write(
        d.join("req.json"),
        r#"{"operation": "read", "target": "notes.txt"}"#,
    )
    .unwrap();
    let obs = p
        .run(&[
            "--format",
            "json",
            "provider",
            "call",
            "read-file/read-file",
            "--input",
            "req.json",
        ])
        .ok()
        .json();
    assert_eq!(obs["observation"]["body"], "hello");
}
