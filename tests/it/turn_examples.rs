//! The example hosts in `examples/hosts/` speak the protocol: the plain-script wrapper turns a
//! command's exit into a valid result (completion proven by a validator, failure → repair), and
//! the Claude Code / Codex wrappers fail cleanly (host_failure) when their tool is not installed.

use crate::support::{Project, turn_run};

fn example(name: &str) -> String {
    format!("{}/examples/hosts/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn plain_script_host_completes_with_a_validator() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let work = p.script(
        "work.sh",
        "echo \"built $LOOPX_TODO_ID\" > artifact.txt\necho done\n",
    );
    let check = p.script("check.sh", "cat >/dev/null\ntest -s artifact.txt\n");
    let out = p.json(&turn_run(
        "a1",
        &["--validate-json", &format!("[\"{check}\"]")],
        &[&example("plain-script.sh"), &work],
    ));
    let t = &out["turn"];
    assert_eq!(t["kind"], "validated_completion", "{t}");
    assert_eq!(p.todo_status("t1"), "completed");
    let ev = p.todo("t1")["evidence"].as_array().unwrap().clone();
    assert_eq!(ev.len(), 1);
    assert!(ev[0]["text"].as_str().unwrap().contains("exit 0"), "{ev:?}");
    let j = p.journal(t["turn_key"].as_str().unwrap());
    assert_eq!(j["data"]["result"]["observations"][0]["kind"], "command");
}

#[test]
fn plain_script_host_reports_a_failing_command_as_repair() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let work = p.script(
        "work.sh",
        "echo 'error: \"quoted\" \\ and tab\there' >&2\nexit 4\n",
    );
    let out = p.json(&turn_run("a1", &[], &[&example("plain-script.sh"), &work]));
    let t = &out["turn"];
    assert_eq!(t["kind"], "repair_required", "{t}");
    let todo = p.todo("t1");
    assert_eq!(todo["todo"]["status"], "blocked");
    assert!(
        todo["todo"]["status_reason"]
            .as_str()
            .unwrap()
            .contains("exit 4"),
        "{todo}"
    );
}

#[test]
fn tool_wrappers_fail_cleanly_without_their_tool() {
    for wrapper in ["claude-code.sh", "codex-cli.sh"] {
        let p = Project::with_goal_g();
        p.add_work("t1");
        // PATH is an empty directory: the tool is absent whatever this machine has installed (the
        // wrappers look for it with the shell's `command -v` before running anything else).
        let empty = p.file("empty-path");
        std::fs::create_dir(&empty).unwrap();
        let host = example(wrapper);
        let mut args = vec!["--format", "json"];
        args.extend(turn_run("a1", &[], &[&host]));
        let out = p.command(&args).env("PATH", &empty).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["turn"]["kind"], "host_failure", "{wrapper}: {v}");
        assert!(
            v["turn"]["detail"]
                .as_str()
                .unwrap()
                .contains("not on PATH"),
            "{v}"
        );
        assert_eq!(p.todo_status("t1"), "open");
    }
}
