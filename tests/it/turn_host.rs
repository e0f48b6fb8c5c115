//! Host misbehaviour: each maps to its result kind and leaves state consistent (lease released,
//! nothing spent, no evidence, a run row in history, the journal settled).

use std::time::{Duration, Instant};

use crate::support::{Project, result_host, turn_run, wait_for};
use serde_json::Value;

fn run_turn(p: &Project, host_body: &str, extra: &[&str]) -> Value {
    p.add_work("t1");
    let host = p.script("host.sh", host_body);
    p.json(&turn_run("a1", extra, &[&host]))["turn"].clone()
}

/// The state every failed turn must leave behind.
fn assert_failed_cleanly(p: &Project, turn: &Value, kind: &str) {
    assert_eq!(turn["kind"], kind, "turn: {turn}");
    assert_eq!(turn["status"], "failed");
    assert_eq!(turn["spent"], false);
    assert_eq!(turn["lease"], "released");
    assert_eq!(p.todo_status("t1"), "open", "the todo goes back to open");
    assert!(p.todo("t1")["todo"]["claim"].is_null());
    assert_eq!(p.evidence_count("t1"), 0);
    assert!(p.spends().is_empty(), "nothing spent");
    let runs = p.history();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["classification"], kind);
    let j = p.journal(turn["turn_key"].as_str().unwrap());
    assert_eq!(j["status"], "failed");
    assert_eq!(
        j["phases"].as_array().unwrap().last().unwrap(),
        "terminal_closeout"
    );
    assert!(
        !j["phases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x == "quota_spend")
    );
}

#[test]
fn non_zero_exit_is_host_failure() {
    let p = Project::with_goal_g();
    let t = run_turn(&p, "cat >/dev/null\necho 'it broke' >&2\nexit 3\n", &[]);
    assert_failed_cleanly(&p, &t, "host_failure");
    assert_eq!(t["failed_phase"], "host_execute");
    let detail = t["detail"].as_str().unwrap();
    assert!(
        detail.contains("status 3") && detail.contains("it broke"),
        "{detail}"
    );
}

#[test]
fn non_zero_exit_with_a_valid_result_is_still_host_failure() {
    let p = Project::with_goal_g();
    let body = format!("{}exit 1\n", result_host("completed"));
    let t = run_turn(&p, &body, &["--trust-host-completion"]);
    assert_failed_cleanly(&p, &t, "host_failure");
}

#[test]
fn timeout_kills_the_whole_process_group_quickly() {
    let p = Project::with_goal_g();
    let body = "cat >/dev/null\nsleep 30 &\necho $! > child.pid\nsleep 30\n";
    let started = Instant::now();
    let t = run_turn(&p, body, &["--timeout-seconds", "1"]);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(6), "took {took:?}");
    assert_failed_cleanly(&p, &t, "host_failure");
    let j = p.journal(t["turn_key"].as_str().unwrap());
    assert_eq!(j["data"]["host"]["timed_out"], true);
    let left = crate::support::wait_until_gone(p.path(), Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "the host's background child survived: {left:?}"
    );
}

#[test]
fn garbage_stdout_from_a_successful_host_is_validation_failed() {
    let p = Project::with_goal_g();
    let t = run_turn(&p, "cat >/dev/null\necho 'All done, trust me!'\n", &[]);
    assert_failed_cleanly(&p, &t, "validation_failed");
    assert_eq!(t["failed_phase"], "typed_result");
    assert!(t["detail"].as_str().unwrap().contains("malformed"), "{t}");
}

#[test]
fn oversized_stdout_is_refused() {
    let p = Project::with_goal_g();
    // ~100 KiB of output, over the 64 KiB cap; the host must not block on a full pipe either.
    let body = "cat >/dev/null\ni=0\nwhile [ $i -lt 1600 ]; do echo '0123456789012345678901234567890123456789012345678901234567890123'; i=$((i+1)); done\n";
    let t = run_turn(&p, body, &[]);
    assert_failed_cleanly(&p, &t, "validation_failed");
    let detail = t["detail"].as_str().unwrap();
    assert!(detail.contains("the limit is 65536"), "{detail}");
}

#[test]
fn unknown_result_fields_are_refused() {
    let p = Project::with_goal_g();
    let body = r#"cat >/dev/null
printf '{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"x","evidense":[]}'
"#;
    let t = run_turn(&p, body, &[]);
    assert_failed_cleanly(&p, &t, "validation_failed");
    assert!(t["detail"].as_str().unwrap().contains("evidense"), "{t}");
}

#[test]
fn non_utf8_stdout_is_refused() {
    let p = Project::with_goal_g();
    let t = run_turn(&p, "cat >/dev/null\nprintf '\\377\\376{}'\n", &[]);
    assert_failed_cleanly(&p, &t, "validation_failed");
    assert!(t["detail"].as_str().unwrap().contains("UTF-8"), "{t}");
}

#[test]
fn validator_rejecting_a_completion_claim_is_validation_failed() {
    let p = Project::with_goal_g();
    let validator = p.script(
        "validate.sh",
        "cat > validator-stdin.json\necho 'tests fail' >&2\nexit 1\n",
    );
    let t = run_turn(
        &p,
        &result_host("completed"),
        &["--validate-json", &format!("[\"{validator}\"]")],
    );
    assert_failed_cleanly(&p, &t, "validation_failed");
    assert_eq!(t["failed_phase"], "validation");
    assert!(t["detail"].as_str().unwrap().contains("tests fail"), "{t}");
    // The validator saw the normalized result on stdin.
    let seen: Value =
        serde_json::from_str(&std::fs::read_to_string(p.file("validator-stdin.json")).unwrap())
            .unwrap();
    assert_eq!(seen["status"], "completed");
    assert_eq!(seen["schema_version"], "loopx.turn_result.v1");
}

#[test]
fn validator_accepting_completes_the_todo() {
    let p = Project::with_goal_g();
    let validator = p.script("validate.sh", "cat >/dev/null\nexit 0\n");
    let t = run_turn(
        &p,
        &result_host("completed"),
        &["--validate-json", &format!("[\"{validator}\"]")],
    );
    assert_eq!(t["kind"], "validated_completion");
    assert_eq!(t["spent"], true);
    assert_eq!(p.todo_status("t1"), "completed");
    assert_eq!(p.evidence_count("t1"), 1);
    // `turn run` re-projects the goal state after the turn.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(p.file(".loopx/goals/g/state.json")).unwrap(),
    )
    .unwrap();
    let t1 = state["todos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == "t1")
        .unwrap();
    assert_eq!(t1["status"], "completed");
    // The run report was written once.
    let run_id = p.history()[0]["run_id"].as_str().unwrap().to_string();
    assert!(
        loopx::paths::ProjectPaths::at(p.path())
            .run_md("g", &run_id)
            .exists()
    );
}

#[test]
fn completion_without_validator_is_recorded_as_progress() {
    let p = Project::with_goal_g();
    let t = run_turn(&p, &result_host("completed"), &[]);
    assert_eq!(t["kind"], "validated_progress");
    assert_eq!(t["spent"], true);
    assert_eq!(t["lease"], "released");
    assert_eq!(p.todo_status("t1"), "open", "exit 0 alone proves nothing");
    assert_eq!(p.evidence_count("t1"), 1);
}

#[test]
fn a_child_that_outlives_the_host_is_killed_with_the_group() {
    let p = Project::with_goal_g();
    let body = format!(
        "(sleep 2; touch marker) &\necho $! > child.pid\n{}",
        result_host("progress")
    );
    let t = run_turn(&p, &body, &[]);
    assert_eq!(t["kind"], "validated_progress");
    let left = crate::support::wait_until_gone(p.path(), Duration::from_secs(1));
    assert!(
        left.is_empty(),
        "a background child outlived the host: {left:?}"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !p.file("marker").exists(),
        "the orphaned child ran to completion"
    );
}

#[test]
fn host_gets_request_on_stdin_and_turn_env() {
    let p = Project::with_goal_g();
    let body = format!(
        "cat > request.json\nenv | grep ^LOOPX_ | sort > env.txt\n{}",
        result_host("progress")
    );
    let t = run_turn(&p, &body, &[]);
    let key = t["turn_key"].as_str().unwrap();
    assert!(key.starts_with("turn-"));
    let req: Value =
        serde_json::from_str(&std::fs::read_to_string(p.file("request.json")).unwrap()).unwrap();
    assert_eq!(req["schema_version"], "loopx.turn_request.v1");
    assert_eq!(req["turn_key"], key);
    assert_eq!(req["goal"]["id"], "g");
    assert_eq!(req["todo"]["id"], "t1");
    assert_eq!(req["todo"]["capability"], "builtin:default");
    assert_eq!(req["agent_id"], "a1");
    assert!(req["claim"]["fence"].as_i64().unwrap() >= 1);
    assert_eq!(
        req["result_schema"]["schema_version"], "loopx.turn_result.v1",
        "the host reads the result format"
    );
    // The journal keeps what the host read less the constant result schema, which it adds back
    // when it starts a host: a kilobyte per turn that buys nothing on disk.
    let mut journaled = p.journal(key)["data"]["request"].clone();
    assert!(journaled.get("result_schema").is_none(), "{journaled}");
    journaled["result_schema"] = req["result_schema"].clone();
    assert_eq!(journaled, req);
    let env = std::fs::read_to_string(p.file("env.txt")).unwrap();
    for want in [
        "LOOPX_GOAL_ID=g".to_string(),
        "LOOPX_AGENT_ID=a1".to_string(),
        "LOOPX_TODO_ID=t1".to_string(),
        format!("LOOPX_TURN_KEY={key}"),
        format!(
            "LOOPX_CLAIM_KEY={}",
            req["claim"]["claim_key"].as_str().unwrap()
        ),
    ] {
        assert!(env.contains(&want), "missing {want} in\n{env}");
    }
    assert!(env.contains("LOOPX_ROOT="));
    assert!(!env.contains("LOOPX_TEST_CRASH_AFTER"));
}

/// The host can act as the agent through `loopx` itself, with the lease proof from its env.
#[test]
fn host_can_call_loopx_as_the_lease_holder() {
    let p = Project::with_goal_g();
    let body = format!(
        "cat >/dev/null\n{} todo update --goal-id g --todo-id t1 --evidence 'noted from inside the turn' >/dev/null || exit 9\n{}",
        crate::support::loopx_bin(),
        result_host("progress")
    );
    let t = run_turn(&p, &body, &[]);
    assert_eq!(t["kind"], "validated_progress", "{t}");
    assert_eq!(p.evidence_count("t1"), 2);
}

#[test]
fn missing_program_is_host_failure() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let t = p.json(&turn_run("a1", &[], &["/nonexistent/host"]))["turn"].clone();
    assert_failed_cleanly(&p, &t, "host_failure");
    assert!(
        t["detail"].as_str().unwrap().contains("could not start"),
        "{t}"
    );
}

#[test]
fn sigterm_to_loopx_terminates_the_host_and_settles_the_turn() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    // `host.finished` exists only if the host ran to its end: SIGTERM must cut it short.
    let host = p.script(
        "host.sh",
        "cat >/dev/null\necho $$ > host.pid\nsleep 30\ntouch host.finished\n",
    );
    let child = p.spawn(&[&["--format", "json"][..], &turn_run("a1", &[], &[&host])].concat());
    let pid_file = p.file("host.pid");
    wait_for("the host to start", Duration::from_secs(30), || {
        std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n'))
    });
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        !p.file("host.finished").exists(),
        "loopx let the host run to its end instead of terminating it"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["turn"]["kind"], "host_failure");
    assert!(
        v["turn"]["detail"]
            .as_str()
            .unwrap()
            .contains("interrupted")
    );
    let left = crate::support::wait_until_gone(p.path(), Duration::from_secs(2));
    assert!(left.is_empty(), "the host survived SIGTERM: {left:?}");
    assert_eq!(p.todo_status("t1"), "open");
}

/// The host runs in the goal's project directory; a relative host path is resolved against the
/// directory `loopx` was started in.
#[test]
fn host_runs_in_the_goal_project_dir_and_relative_paths_resolve_from_the_caller() {
    let p = Project::with_goal_g();
    let work = p.file("work");
    std::fs::create_dir(&work).unwrap();
    p.ok(&[
        "goal",
        "create",
        "--title",
        "Elsewhere",
        "--id",
        "g2",
        "--project",
        work.to_str().unwrap(),
    ]);
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g2",
        "--id",
        "w1",
        "--title",
        "work elsewhere",
    ]);
    p.script(
        "host.sh",
        &format!("pwd > where.txt\n{}", result_host("progress")),
    );
    let out = p.json(&[
        "turn",
        "run",
        "--goal-id",
        "g2",
        "--agent-id",
        "a1",
        "--",
        "./host.sh",
    ]);
    assert_eq!(out["turn"]["kind"], "validated_progress", "{out}");
    let where_ = std::fs::read_to_string(work.join("where.txt")).unwrap();
    assert!(where_.trim().ends_with("/work"), "{where_}");
}

#[test]
fn turn_list_shows_the_newest_turns_first_and_filters_them() {
    let p = Project::with_goal_g();
    let failed = run_turn(&p, "cat >/dev/null\nexit 3\n", &[]);
    p.add_work("t2");
    let host = p.script("ok.sh", &result_host("completed"));
    let done = p.json(&turn_run("a2", &["--todo-id", "t2"], &[&host]))["turn"].clone();
    let keys = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["turn", "list"];
        all.extend_from_slice(args);
        p.json(&all)["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["turn_key"].as_str().unwrap().to_owned())
            .collect()
    };
    let (failed, done) = (
        failed["turn_key"].as_str().unwrap().to_owned(),
        done["turn_key"].as_str().unwrap().to_owned(),
    );
    assert_eq!(keys(&[]), [done.clone(), failed.clone()]);
    assert_eq!(keys(&["--status", "failed"]), [failed]);
    assert_eq!(keys(&["--goal-id", "g", "--limit", "1"]), [done]);
    let text = p.ok(&["turn", "list"]);
    assert!(text.stdout.contains("2 turn(s), newest first"));
    for (args, code) in [
        (vec!["--goal-id", "nope"], 3),
        (vec!["--status", "done"], 2),
        (vec!["--limit", "0"], 2),
    ] {
        let mut all = vec!["turn", "list"];
        all.extend_from_slice(&args);
        assert_eq!(p.run(&all).code, code, "{args:?}");
    }
}

/// Operator authority cannot be faked from inside a turn: whatever the host does to its
/// environment (variables unset, blanked, forged, or a clean environment), operator commands
/// are refused and `.loopx/` cannot be read or written, because the host runs in namespaces
/// where `.loopx/` is covered and its `loopx` calls reach the driver only as the turn's agent.
#[test]
fn operator_commands_from_inside_a_host_are_refused_whatever_the_environment() {
    let p = Project::with_goal_g();
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "t2",
        "--kind",
        "user_gate",
        "--blocks-agent",
        "other",
        "--title",
        "Approve",
    ]);
    p.ok(&[
        "quota",
        "spend-slot",
        "--goal-id",
        "g",
        "--effect-id",
        "op1",
    ]);
    p.ok(&["refresh-state", "--goal-id", "g"]);
    let run_id = p.history()[0]["run_id"].as_str().unwrap().to_string();
    let loopx = crate::support::loopx_bin();
    let body = format!(
        r#"cat >/dev/null
try() {{ label=$1; shift; "$@" >/dev/null 2>&1; echo "$label $?" >> authority.log; }}
for variant in given unset blank forged clean; do
  case $variant in
    given)  run() {{ "$@"; }} ;;
    unset)  run() {{ env -u LOOPX_AGENT_SOCKET -u LOOPX_TURN_KEY -u LOOPX_AGENT_ID -u LOOPX_CLAIM_KEY "$@"; }} ;;
    blank)  run() {{ env LOOPX_AGENT_SOCKET= LOOPX_TURN_KEY= LOOPX_AGENT_ID= LOOPX_CLAIM_KEY= "$@"; }} ;;
    forged) run() {{ env LOOPX_AGENT_SOCKET=/tmp/forged.sock LOOPX_TURN_KEY=forged LOOPX_AGENT_ID=operator "$@"; }} ;;
    clean)  run() {{ env -i PATH=/usr/bin:/bin "$@" --root "$LOOPX_ROOT"; }} ;;
  esac
  try "$variant:gate" run {loopx} gate resolve --goal-id g --todo-id t2 --comment forged
  try "$variant:quota-set" run {loopx} quota set --goal-id g --allowed-slots 99
  try "$variant:void" run {loopx} quota void-slot --goal-id g --effect-id op1
  try "$variant:reward" run {loopx} reward add --goal-id g --run-id {run_id} --score 1
  try "$variant:close" run {loopx} goal close --goal-id g
  try "$variant:init" run {loopx} init
done
try read:relative cat .loopx/loopx.db
try read:absolute cat "$LOOPX_ROOT/.loopx/loopx.db"
try read:proc-root cat "/proc/1/root$LOOPX_ROOT/.loopx/loopx.db"
try write:create touch .loopx/planted
try write:remove rm .loopx/loopx.db
try write:umount umount -l .loopx
try read:after-umount cat .loopx/loopx.db
{}"#,
        result_host("progress")
    );
    let t = run_turn(&p, &body, &["--isolation", "required"]);
    assert_eq!(t["kind"], "validated_progress", "{t}");
    assert_eq!(t["isolation"], "namespace", "{t}");
    let log = std::fs::read_to_string(p.file("authority.log")).unwrap();
    let attempts: Vec<(&str, &str)> = log.lines().map(|l| l.split_once(' ').unwrap()).collect();
    assert_eq!(attempts.len(), 5 * 6 + 7, "{log}");
    for (what, code) in &attempts {
        assert_ne!(*code, "0", "{what} succeeded from inside the turn:\n{log}");
    }
    // Nothing an operator command would have changed did change.
    assert_eq!(p.todo_status("t2"), "open", "the gate is still open");
    let q = p.json(&["quota", "show", "--goal-id", "g"]);
    assert!(q["quota"]["policy"]["allowed_slots"].is_null(), "{q}");
    assert!(
        q["recent_ledger"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["kind"] != "void"),
        "{q}"
    );
    let goal = p.json(&["goal", "show", "--goal-id", "g"]);
    assert_eq!(goal["goal"]["status"], "active", "{goal}");
    let summary = p.json(&["summary_all", "--goal-id", "g"]);
    assert!(!summary.to_string().contains("\"score\":1"), "{summary}");
    assert!(p.state().join("loopx.db").exists());
    assert!(!p.state().join("planted").exists());
}

/// Where the OS cannot isolate (here: user namespaces exhausted inside the test's own
/// namespace), `--isolation required` refuses before anything is claimed, and `auto` runs the
/// turn with `isolation: none` and a warning.
#[test]
fn a_machine_that_cannot_isolate_refuses_required_and_warns_on_auto() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script("host.sh", &result_host("progress"));
    let no_namespaces = |isolation: &str| {
        let script = format!(
            "echo 0 > /proc/sys/user/max_user_namespaces && exec {} --format json turn run \
             --goal-id g --agent-id a1 --isolation {isolation} -- {host}",
            crate::support::loopx_bin()
        );
        let out = std::process::Command::new("unshare")
            .args(["--user", "--map-current-user", "sh", "-c", &script])
            .current_dir(p.path())
            .output()
            .expect("unshare (util-linux) runs the test in a user namespace");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, _, err) = no_namespaces("required");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--isolation required"), "{err}");
    assert_eq!(p.todo_status("t1"), "open", "nothing was claimed");
    assert!(p.hosts_log().is_empty(), "the host did not run");

    let (code, out, err) = no_namespaces("auto");
    assert_eq!(code, Some(0), "{err}");
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["turn"]["isolation"], "none", "{t}");
    assert_eq!(t["turn"]["kind"], "validated_progress");
    assert!(
        t["turn"]["warnings"]
            .to_string()
            .contains("isolation: none"),
        "{t}"
    );
}

/// With no usable temporary directory the agent channel cannot start, and the turn's warning
/// says what that means for the host's own `loopx` calls, which differs with isolation: an
/// unisolated host still reaches the project (directly, as the turn's agent), an isolated one
/// cannot reach it at all.
#[test]
fn a_turn_without_its_agent_channel_warns_with_what_the_host_can_still_do() {
    let loopx = crate::support::loopx_bin();
    let body = format!(
        "{loopx} --format json todo show --goal-id g --todo-id t1 > /dev/null 2>&1; \
         echo \"show $?\" >> calls.log\n{}",
        result_host("progress")
    );
    for (isolation, reached) in [("off", true), ("required", false)] {
        let p = Project::with_goal_g();
        p.add_work("t1");
        let host = p.script("host.sh", &body);
        let mut args = vec!["--format", "json"];
        args.extend(turn_run("a1", &["--isolation", isolation], &[&host]));
        let run = p
            .run_env(&args, &[("TMPDIR", "/nonexistent/loopx-test-tmp")])
            .ok();
        let t = run.json()["turn"].clone();
        assert_eq!(t["kind"], "validated_progress", "{t}");
        let warnings = t["warnings"].to_string();
        assert!(
            warnings.contains("agent channel could not be started"),
            "{t}"
        );
        assert!(warnings.contains("TMPDIR"), "{t}");
        let calls = std::fs::read_to_string(p.file("calls.log")).unwrap();
        if reached {
            assert_eq!(calls.trim(), "show 0", "{calls}");
            assert!(warnings.contains("open the project directly"), "{t}");
        } else {
            assert_ne!(calls.trim(), "show 0", "{calls}");
            assert!(warnings.contains("calls fail"), "{t}");
        }
    }
}

/// A loop's text lists its turns' warnings once each (here: hosts run without isolation), as
/// `turn run` lists a turn's.
#[test]
fn a_loop_shows_its_turns_warnings_once() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    let host = p.script("host.sh", &result_host("completed"));
    let args = [
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--until-idle",
        "--isolation",
        "off",
        "--",
        host.as_str(),
    ];
    let text = p.run(&args);
    assert_eq!(text.code, 0, "{text:?}");
    assert_eq!(
        text.stdout
            .matches("isolation: none (--isolation off)")
            .count(),
        1,
        "{}",
        text.stdout
    );
}
