//! The kernel through the CLI: the seeds' tick as they write it, readiness, gates, the should-run
//! routes, quota, history and every command in every format.

use crate::support::Project;
use serde_json::Value;

#[test]
fn the_seed_tick_works_as_written() {
    let p = Project::new();
    p.json(&[
        "project_prompt",
        "create",
        "--title",
        "Investigate Quarterly Revenue Spike",
        "--description",
        "Analyze data",
    ]);
    let list = p.run(&["project_prompt", "list", "--json"]).ok().json();
    let goal = list.as_array().expect("a bare JSON array")[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    p.add_todo(&goal, "[P0] Load the data", &[]);

    let packet = p.json(&["quota", "should-run", "--goal-id", &goal]);
    assert_eq!(packet["should_run"], true);
    assert_eq!(packet["route"], "ready_for_host");
    let actions = packet["interaction_contract"]["cli_channel"]["next_cli_actions"]
        .as_array()
        .unwrap();
    assert!(
        actions[0]
            .as_str()
            .unwrap()
            .starts_with(&format!("loopx todo claim --goal-id {goal} --todo-id t1"))
    );

    let claim = p.json(&["todo", "claim", "--goal-id", &goal]);
    let todo = claim["todo"]["id"].as_str().unwrap().to_string();
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &goal,
        "--todo-id",
        &todo,
        "--evidence",
        "model output: spike explained",
        "--status",
        "completed",
    ]);
    let refresh = p.json(&["refresh-state", "--goal-id", &goal]);
    let run_id = refresh["run_id"].as_str().unwrap().to_string();
    assert!(std::path::Path::new(refresh["json_path"].as_str().unwrap()).is_file());
    assert!(std::path::Path::new(refresh["markdown_path"].as_str().unwrap()).is_file());
    let spend = p.json(&["quota", "spend-slot", "--goal-id", &goal]);
    assert_eq!(spend["appended"], true);
    assert_eq!(spend["after"]["spent_slots"], 1);
    let retry = p.json(&["quota", "spend-slot", "--goal-id", &goal]);
    assert_eq!(
        retry["idempotent_replay"], true,
        "the same spend retried never counts twice"
    );
    assert_eq!(retry["after"]["spent_slots"], 1);

    p.json(&[
        "reward",
        "add",
        "--goal-id",
        &goal,
        "--run-id",
        &run_id,
        "--score",
        "1.0",
        "--comment",
        "Forecast looks accurate",
    ]);
    let summary = p.json(&["summary_all", "--goal-id", &goal]);
    assert_eq!(
        summary["recent_rewards"][0]["comment"],
        "Forecast looks accurate"
    );
    assert_eq!(
        summary["recent_evidence"][0]["text"],
        "model output: spike explained"
    );
    let status = p.json(&["status", "--goal-id", &goal]);
    assert_eq!(status["goals"][0]["goal"]["id"], goal.as_str());
    p.json(&["project_prompt", "close", "--goal-id", &goal]);
    assert_eq!(
        p.json(&["goal", "show", "--goal-id", &goal])["goal"]["status"],
        "closed"
    );
    let closed = p.json(&["quota", "should-run", "--goal-id", &goal]);
    assert_eq!(closed["route"], "blocked");
    assert_eq!(closed["scheduler_hint"]["action"], "stop");
}

#[test]
fn start_goal_initializes_a_fresh_directory() {
    let p = Project::empty();
    let v = p.json(&[
        "start-goal",
        "--goal-text",
        "Run a multi-day benchmark suite",
        "--project",
        ".",
    ]);
    assert_eq!(v["initialized_project"], true);
    assert!(p.state().join("loopx.db").is_file());
    let id = v["goal"]["id"].as_str().unwrap();
    assert!(p.state().join(format!("goals/{id}/state.json")).is_file());
    assert!(p.state().join(format!("goals/{id}/STATE.md")).is_file());
}

#[test]
fn a_todo_is_ready_only_when_its_dependencies_are_completed() {
    let p = Project::new();
    let g = p.goal("deps");
    let a = p.add_todo(&g, "[P3] first", &[]);
    let b = p.add_todo(&g, "[P0] second", &["--depends-on", &a]);
    // b outranks a but waits for it.
    assert_eq!(
        p.json(&["quota", "should-run", "--goal-id", &g])["selected_todo"]["id"],
        a.as_str()
    );
    let r = p.run(&["todo", "claim", "--goal-id", &g, "--todo-id", &b]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("depends on"), "{}", r.stderr);
    p.json(&[
        "todo",
        "complete",
        "--goal-id",
        &g,
        "--todo-id",
        &a,
        "--evidence",
        "done",
    ]);
    assert_eq!(
        p.json(&["todo", "claim", "--goal-id", &g])["todo"]["id"],
        b.as_str()
    );
    // A missing dependency is refused at add time.
    assert_eq!(
        p.run(&[
            "todo",
            "add",
            "--goal-id",
            &g,
            "--title",
            "x",
            "--depends-on",
            "nope"
        ])
        .code,
        3
    );
}

#[test]
fn gates_block_exactly_the_agents_they_scope() {
    let p = Project::new();
    let g = p.goal("gates");
    p.add_todo(&g, "work one", &[]);
    p.add_todo(&g, "work two", &[]);
    let scoped = p.add_todo(
        &g,
        "approve a1's plan",
        &["--kind", "user_gate", "--blocks-agent", "a1"],
    );
    let route = |agent: &str| {
        p.json(&["quota", "should-run", "--goal-id", &g, "--agent-id", agent])["route"].clone()
    };
    assert_eq!(route("a1"), "user_action_required");
    assert_eq!(route("a2"), "ready_for_host");
    assert_eq!(
        p.run(&["todo", "claim", "--goal-id", &g, "--agent-id", "a1"])
            .code,
        1
    );
    p.json(&["todo", "claim", "--goal-id", &g, "--agent-id", "a2"]);

    let global = p.add_todo(
        &g,
        "approve publishing",
        &["--kind", "user_gate", "--global-gate"],
    );
    assert_eq!(route("a2"), "user_action_required");
    assert_eq!(route("a3"), "user_action_required");
    let packet = p.json(&["quota", "should-run", "--goal-id", &g, "--agent-id", "a3"]);
    assert_eq!(
        packet["interaction_contract"]["user_channel"]["action_required"],
        true
    );
    assert!(
        packet["interaction_contract"]["user_channel"]["operator_cli_actions"][0]
            .as_str()
            .unwrap()
            .contains("gate resolve")
    );

    let info = p.add_todo(&g, "read the report", &["--kind", "user_action"]);
    let gates = p.json(&["gate", "list", "--goal-id", &g]);
    assert_eq!(gates["gates"].as_array().unwrap().len(), 3);
    p.json(&["gate", "resolve", "--goal-id", &g, "--todo-id", &global]);
    assert_eq!(
        route("a3"),
        "ready_for_host",
        "a user_action informs, it does not block"
    );
    assert_eq!(route("a1"), "user_action_required");
    p.json(&[
        "gate",
        "resolve",
        "--goal-id",
        &g,
        "--todo-id",
        &scoped,
        "--reject",
        "--comment",
        "no",
    ]);
    assert_eq!(
        p.json(&["todo", "show", "--goal-id", &g, "--todo-id", &scoped])["todo"]["status"],
        "archived"
    );
    assert_eq!(route("a1"), "ready_for_host");
    assert_eq!(
        p.run(&["todo", "claim", "--goal-id", &g, "--todo-id", &info])
            .code,
        2,
        "gates are not claimed"
    );
}

#[test]
fn should_run_routes_wait_replan_blocked_and_repair() {
    let p = Project::new();
    let g = p.goal("routes");
    assert_eq!(
        p.json(&["quota", "should-run", "--goal-id", &g])["route"],
        "replan_required"
    );
    let t = p.add_todo(&g, "only", &[]);
    p.json(&Project::todo_args("claim", &g, &t, "other", &[]));
    let waiting = p.json(&["quota", "should-run", "--goal-id", &g]);
    assert_eq!(waiting["route"], "wait", "{waiting}");
    assert_eq!(
        p.json(&[
            "quota",
            "should-run",
            "--goal-id",
            &g,
            "--agent-id",
            "other"
        ])["selected_todo"]["selected_by"],
        "current_claim"
    );

    p.add_todo(&g, "second", &[]);
    p.json(&["quota", "set", "--goal-id", &g, "--allowed-slots", "1"]);
    p.json(&["quota", "spend-slot", "--goal-id", &g, "--effect-id", "e1"]);
    let throttled = p.json(&["quota", "should-run", "--goal-id", &g]);
    assert_eq!(throttled["route"], "wait");
    assert_eq!(throttled["quota"]["state"], "throttled");
    assert_eq!(throttled["scheduler_hint"]["action"], "wait_for_quota");
    assert!(
        throttled["scheduler_hint"]["next_check_after_seconds"]
            .as_u64()
            .unwrap()
            > 3600
    );
    p.json(&["quota", "void-slot", "--goal-id", &g, "--effect-id", "e1"]);
    assert_eq!(
        p.json(&["quota", "should-run", "--goal-id", &g])["route"],
        "ready_for_host"
    );

    p.json(&[
        "quota",
        "set",
        "--goal-id",
        &g,
        "--compute",
        "0",
        "--clear-allowed-slots",
    ]);
    assert_eq!(
        p.json(&["quota", "should-run", "--goal-id", &g])["route"],
        "blocked"
    );
    p.json(&["quota", "set", "--goal-id", &g, "--compute", "1"]);
    p.json(&["goal", "pause", "--goal-id", &g]);
    assert_eq!(
        p.json(&["quota", "should-run", "--goal-id", &g])["route"],
        "blocked"
    );
    assert_eq!(
        p.run(&["todo", "claim", "--goal-id", &g]).code,
        1,
        "paused goals hand out no work"
    );
    p.json(&["goal", "resume", "--goal-id", &g]);

    p.add_todo(&g, "needs a plugin", &["--capability", "missing-ext/fixer"]);
    let repair = p.json(&["quota", "should-run", "--goal-id", &g]);
    assert_eq!(repair["route"], "repair_required");
    assert_eq!(
        repair["interaction_contract"]["agent_channel"]["missing_capabilities"][0],
        "missing-ext/fixer"
    );
}

#[test]
fn history_pages_newest_first_with_reward_overlays() {
    let p = Project::new();
    let g = p.goal("hist");
    let ids: Vec<String> = (0..5)
        .map(|_| {
            p.json(&["refresh-state", "--goal-id", &g])["run_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    p.json(&[
        "reward",
        "add",
        "--goal-id",
        &g,
        "--run-id",
        &ids[1],
        "--score",
        "-0.5",
        "--comment",
        "meh",
    ]);
    let page = p.json(&["history", "--goal-id", &g, "--limit", "2"]);
    let runs = page["runs"].as_array().unwrap();
    assert_eq!(runs[0]["run_id"], ids[4].as_str());
    assert_eq!(runs[1]["run_id"], ids[3].as_str());
    let older = p.json(&[
        "history",
        "--goal-id",
        &g,
        "--limit",
        "10",
        "--before",
        page["next_before"].as_str().unwrap(),
    ]);
    assert!(
        older["next_before"].is_null(),
        "a short page is the last: {older}"
    );
    let older = older["runs"].as_array().unwrap();
    assert_eq!(older.len(), 3);
    assert_eq!(older[1]["rewards"][0]["score"], -0.5);
    // A cursor is a run of this goal: any other id is refused, never read as "from the newest"
    // or "past the oldest".
    for (cursor, code) in [
        ("ZZZZZZZZZZZZZZZZZZZZZZZZZZ", 3),
        ("00000000000000000000000000", 3),
        ("no such run", 2),
    ] {
        let r = p.run(&["history", "--goal-id", &g, "--before", cursor]);
        assert_eq!(r.code, code, "--before {cursor:?}: {}", r.stderr);
    }
    // Run reports are immutable files named by run id (in the month folder of the id).
    let report = loopx::paths::ProjectPaths::at(p.path()).run_json(&g, &ids[0]);
    let v: Value = serde_json::from_slice(&std::fs::read(report).unwrap()).unwrap();
    assert_eq!(v["run_id"], ids[0].as_str());
}

#[test]
fn probe_is_stored_and_shown_never_run() {
    let p = Project::new();
    let g = p.goal("probe");
    let marker = p.path().join("marker");
    let cmd = format!("touch {}", marker.display());
    p.json(&["probe", "set", "--goal-id", &g, "--text", &cmd]);
    assert_eq!(
        p.json(&["probe", "show", "--goal-id", &g])["next_probe"],
        cmd.as_str()
    );
    p.json(&["refresh-state", "--goal-id", &g]);
    p.json(&["status"]);
    assert!(!marker.exists());
    let reg = loopx::registry::inspect_registry(p.state().join("registry.json"));
    assert!(reg.ok);
    p.json(&["probe", "set", "--goal-id", &g, "--clear"]);
    assert_eq!(
        p.json(&["probe", "show", "--goal-id", &g])["next_probe"],
        Value::Null
    );
}

#[test]
fn every_command_speaks_every_format() {
    let p = Project::new();
    let g = p.goal("fmt");
    let t = p.add_todo(&g, "work", &[]);
    let gate = p.add_todo(&g, "gate", &["--kind", "user_gate", "--blocks-agent", "zz"]);
    let run = p.json(&["refresh-state", "--goal-id", &g])["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let commands: Vec<Vec<&str>> = vec![
        vec!["goal", "list"],
        vec!["goal", "show", "--goal-id", &g],
        vec!["todo", "list", "--goal-id", &g],
        vec!["todo", "show", "--goal-id", &g, "--todo-id", &t],
        vec!["gate", "list", "--goal-id", &g],
        vec!["quota", "should-run", "--goal-id", &g],
        vec!["quota", "show", "--goal-id", &g],
        vec!["history", "--goal-id", &g],
        vec!["summary_all", "--goal-id", &g],
        vec!["status"],
        vec!["probe", "show", "--goal-id", &g],
        vec!["doctor"],
    ];
    for args in &commands {
        for format in ["text", "json", "markdown"] {
            let mut full = vec!["--format", format];
            full.extend_from_slice(args);
            let r = p.run(&full).ok();
            assert!(!r.stdout.trim().is_empty(), "{full:?}");
            match format {
                "json" => {
                    let v = r.json();
                    let schema = v["schema_version"].as_str().unwrap_or_default();
                    assert!(
                        schema.starts_with("loopx.") && schema.ends_with(".v1"),
                        "{full:?}: {schema}"
                    );
                    assert_eq!(v["ok"], true);
                }
                "markdown" => assert!(r.stdout.starts_with("# "), "{full:?}: {}", r.stdout),
                _ => {}
            }
        }
    }
    // Mutating commands too, one format each round.
    let mutations: Vec<(&str, Vec<String>)> = vec![
        (
            "markdown",
            vec![
                "todo",
                "claim",
                "--goal-id",
                &g,
                "--todo-id",
                &t,
                "--agent-id",
                "m",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "text",
            vec![
                "todo",
                "renew",
                "--goal-id",
                &g,
                "--todo-id",
                &t,
                "--agent-id",
                "m",
                "--fence",
                "1",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "json",
            vec![
                "todo",
                "release",
                "--goal-id",
                &g,
                "--todo-id",
                &t,
                "--agent-id",
                "m",
                "--fence",
                "1",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "markdown",
            vec![
                "reward",
                "add",
                "--goal-id",
                &g,
                "--run-id",
                &run,
                "--score",
                "1",
            ]
            .into_iter()
            .map(String::from)
            .collect(),
        ),
        (
            "markdown",
            vec!["gate", "resolve", "--goal-id", &g, "--todo-id", &gate]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        (
            "markdown",
            vec!["quota", "set", "--goal-id", &g, "--per-agent-cap", "5"]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
    ];
    for (format, args) in mutations {
        let mut full = vec!["--format", format];
        full.extend(args.iter().map(String::as_str));
        p.run(&full).ok();
    }
    // Errors in JSON mode are JSON too.
    let err = p.run(&[
        "--format",
        "json",
        "todo",
        "show",
        "--goal-id",
        &g,
        "--todo-id",
        "t404",
    ]);
    assert_eq!(err.code, 3);
    let v = err.json();
    assert_eq!(v["ok"], false);
    assert_eq!(v["error"]["kind"], "not_found");
    assert_eq!(v["error"]["exit_code"], 3);
}

#[test]
fn root_flag_and_env_select_the_project() {
    let p = Project::new();
    p.goal("rooted");
    let elsewhere = tempfile::tempdir().unwrap();
    let root = p.path().display().to_string();
    let run = |args: &[&str], env: Option<&str>| {
        let mut cmd = std::process::Command::new(crate::support::loopx_bin());
        cmd.args(args)
            .current_dir(elsewhere.path())
            .env_remove("LOOPX_ROOT");
        if let Some(r) = env {
            cmd.env("LOOPX_ROOT", r);
        }
        crate::support::to_run(cmd.output().unwrap())
    };
    assert_eq!(
        run(&["goal", "list"], None).code,
        3,
        "no project upward from an unrelated directory"
    );
    assert_eq!(
        run(&["--root", &root, "--format", "json", "goal", "list"], None)
            .ok()
            .json()["goals"][0]["id"],
        "rooted"
    );
    assert_eq!(
        run(&["--format", "json", "goal", "list"], Some(&root))
            .ok()
            .json()["goals"][0]["id"],
        "rooted"
    );
    // Discovery upward from a subdirectory.
    let sub = p.path().join("a/b");
    std::fs::create_dir_all(&sub).unwrap();
    let mut cmd = std::process::Command::new(crate::support::loopx_bin());
    cmd.args(["--format", "json", "goal", "list"])
        .current_dir(&sub)
        .env_remove("LOOPX_ROOT");
    assert_eq!(
        crate::support::to_run(cmd.output().unwrap()).ok().json()["goals"][0]["id"],
        "rooted"
    );
}

#[test]
fn a_blocked_todo_is_an_operator_item_in_the_attention_queue() {
    let p = Project::new();
    let g = p.goal("blocked");
    let t = p.add_todo(&g, "needs credentials", &[]);
    p.add_todo(&g, "other work", &[]);
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--status",
        "blocked",
        "--reason",
        "no API key",
    ]);
    let status = p.json(&["status", "--goal-id", &g]);
    let first = &status["attention"][0];
    assert_eq!(first["who"], "operator", "{status}");
    assert_eq!(first["kind"], "blocked");
    assert_eq!(first["todo_id"], t.as_str());
    assert_eq!(first["reason"], "no API key");
    // Reopening it is an operator decision; afterwards it is ordinary work again.
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--status",
        "open",
    ]);
    let status = p.json(&["status", "--goal-id", &g]);
    assert!(
        status["attention"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["kind"] != "blocked")
    );
}

#[test]
fn wasm_commands_run_in_loopx_wasm_beside_the_kernel_binary() {
    // `loopx` hands turn/loop/extension/capability/provider to `loopx-wasm` beside it.
    let p = Project::new();
    let listed = p.json(&["extension", "list"]);
    assert!(listed.is_object() || listed.is_array(), "{listed}");

    // Installed without its host, the kernel commands still work and the wasm ones say why not.
    let lonely = tempfile::tempdir().unwrap();
    let bin = lonely.path().join("loopx");
    std::fs::copy(crate::support::loopx_bin(), &bin).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(&bin)
            .args(args)
            .current_dir(p.dir.path())
            .output()
            .unwrap()
    };
    assert!(run(&["status"]).status.success());
    let out = run(&["extension", "list"]);
    assert_eq!(out.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("loopx-wasm"), "{stderr}");
    assert!(
        stderr.contains(&lonely.path().display().to_string()),
        "{stderr}"
    );
}

/// `refresh-state` caches each todo's rendered lines and copies them on later refreshes; every
/// write of a todo must invalidate its lines. After each change, the todos in `state.json` must
/// equal a fresh render of the same todos (`todo list`), and STATE.md must list the change.
#[test]
fn state_json_matches_a_fresh_render_after_every_change() {
    let p = Project::new();
    let g = p.goal("g");
    let ids: Vec<String> = (0..6)
        .map(|i| p.add_todo(&g, &format!("todo {i}"), &[]))
        .collect();
    let dependent = p.add_todo(
        &g,
        "after the first two",
        &["--depends-on", &ids[0], "--depends-on", &ids[1]],
    );
    let check = |label: &str| -> String {
        p.json(&["refresh-state", "--goal-id", &g]);
        let state: Value = serde_json::from_str(
            &std::fs::read_to_string(p.state().join("goals/g/state.json")).unwrap(),
        )
        .unwrap();
        let listed = p.json(&["todo", "list", "--goal-id", &g]);
        assert_eq!(state["todos"], listed["todos"], "{label}");
        std::fs::read_to_string(p.state().join("goals/g/STATE.md")).unwrap()
    };
    check("first refresh renders every todo and caches the lines");
    check("second refresh copies the cached lines");
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &g,
        "--todo-id",
        &ids[1],
        "--title",
        "renamed \"quoted\"",
    ]);
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &g,
        "--todo-id",
        &ids[2],
        "--priority",
        "P0",
    ]);
    p.json(&Project::todo_args("claim", &g, &ids[3], "a1", &[]));
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &g,
        "--todo-id",
        &ids[0],
        "--status",
        "completed",
        "--evidence",
        "done",
    ]);
    let md = check("changed todos are rendered afresh");
    assert!(md.contains("renamed \"quoted\""), "{md}");
    assert!(
        md.contains(&format!("`{}` (claimed, claimed by a1 fence 1)", ids[3])),
        "{md}"
    );
    assert!(
        md.contains(&format!("- [x] [P2] todo 0 `{}` (completed)", ids[0])),
        "{md}"
    );
    assert!(
        md.contains(&format!(
            "`{dependent}` (open, after {}, {})",
            ids[0], ids[1]
        )),
        "{md}"
    );
    let agent_list = md.split("## Agent todos").nth(1).unwrap();
    assert!(
        agent_list.find(&ids[2]).unwrap() < agent_list.find(&ids[0]).unwrap(),
        "a todo raised to P0 moves up: {agent_list}"
    );
    check("and the same again from the cache");
    let refresh = p.json(&["refresh-state", "--goal-id", &g]);
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(refresh["json_path"].as_str().unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        report["payload"]["todo_counts"],
        serde_json::json!({"agent": {"claimed": 1, "completed": 1, "open": 5}}),
        "the run counts the same rows the projection shows"
    );
    p.json(&Project::todo_args(
        "release",
        &g,
        &ids[3],
        "a1",
        &["--fence", "1"],
    ));
    let md = check("a released claim leaves the lines");
    assert!(md.contains(&format!("todo 3 `{}` (open)", ids[3])), "{md}");
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    // `loopx todo list --format json | head -1`: the reader leaves early. The command's work is
    // done, so LoopX exits 0 without a panic message rather than crashing on the write.
    let p = Project::new();
    let g = p.goal("g1");
    for i in 0..50 {
        p.add_todo(&g, &format!("todo {i}"), &[]);
    }
    for args in [
        vec!["todo", "list", "--goal-id", g.as_str(), "--format", "json"],
        vec![
            "todo",
            "show",
            "--goal-id",
            g.as_str(),
            "--todo-id",
            "t404",
            "--format",
            "json",
        ],
    ] {
        let mut child = p
            .command(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // the reader is gone before anything is written
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        let expected = if args[1] == "list" { 0 } else { 3 };
        assert_eq!(out.status.code(), Some(expected), "{args:?}: {stderr}");
    }
}

/// Whether `cc` finds glibc's `libc.a`: the check `.cargo/static-bins` makes before linking
/// `loopx` statically.
#[cfg(unix)]
fn glibc_static_library_installed() -> bool {
    std::process::Command::new("cc")
        .arg("-print-file-name=libc.a")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"/"))
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu", target_arch = "x86_64"))]
fn loopx_is_linked_statically_where_glibc_allows() {
    /// How the ELF executable at `path` is linked: whether it names a dynamic loader (a `PT_INTERP`
    /// program header, so every start maps and relocates shared libraries first) and whether it is
    /// position-independent (`ET_DYN`, relocated at every start) rather than `ET_EXEC`.
    fn elf_linking(path: &str) -> (bool, bool) {
        const ET_DYN: u16 = 3;
        const PT_INTERP: u32 = 3;
        let elf = std::fs::read(path).unwrap();
        assert_eq!(&elf[..4], b"\x7fELF", "{path} is not an ELF file");
        assert_eq!(elf[4], 2, "{path} is not a 64-bit ELF file");
        let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap());
        let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
        let (phentsize, phnum) = (u16_at(0x36) as usize, u16_at(0x38) as usize);
        let interp = (0..phnum).any(|i| {
            let at = phoff + i * phentsize;
            u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) == PT_INTERP
        });
        (interp, u16_at(0x10) == ET_DYN)
    }

    // `.cargo/static-bins` links `loopx` with `+crt-static` and position-dependent, which saves
    // every command of a tick its shared libraries and relocations; it stays dynamic only when
    // glibc's static libraries are not installed.
    if !glibc_static_library_installed() {
        crate::support::skip(
            "static-glibc",
            "glibc's libc.a is not installed: loopx is dynamic by design on this machine",
        );
        return;
    }
    let loopx = env!("CARGO_BIN_EXE_loopx");
    assert_eq!(
        elf_linking(loopx),
        (false, false),
        "loopx (needs the dynamic loader, is position-independent): \
         was it built without .cargo/static-bins?"
    );
    // Static glibc serves name lookup (NSS) only from the glibc it was linked against; `loopx`
    // must not need it. A dependency that brought in `getaddrinfo` or `getpwnam` would.
    let image = std::fs::read(loopx).unwrap();
    assert!(
        !image.windows(13).any(|w| w == b"nsswitch.conf"),
        "loopx links glibc's name-service code, which a static binary cannot rely on"
    );
    // `loopx-wasm` hosts untrusted WebAssembly and calls name lookup: a dynamic PIE.
    let wasm = std::path::Path::new(loopx).with_file_name("loopx-wasm");
    assert_eq!(elf_linking(wasm.to_str().unwrap()), (true, true));
}

#[test]
#[cfg(unix)]
fn the_static_link_wrapper_adds_its_flags_to_the_loopx_executable_alone() {
    // `.cargo/static-bins` with `echo` standing in for rustc: it prints the arguments it would
    // run rustc with.
    let wrapper = concat!(env!("CARGO_MANIFEST_DIR"), "/.cargo/static-bins");
    let run = |package: &str, args: &str, path: Option<&str>| {
        let mut cmd = std::process::Command::new("sh");
        cmd.arg(wrapper).arg("echo").args(args.split(' '));
        cmd.env("CARGO_PKG_NAME", package);
        if let Some(path) = path {
            cmd.env("PATH", path);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{args}");
        let echoed = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        (echoed, String::from_utf8(out.stderr).unwrap())
    };
    let flags = " -C target-feature=+crt-static -C relocation-model=static";
    let linux = "--target x86_64-unknown-linux-gnu";
    let has_libc_a = glibc_static_library_installed();
    for (package, args, gets_flags) in [
        (
            "loopx",
            format!("--crate-name loopx --edition=2024 src/main.rs --crate-type bin {linux}"),
            has_libc_a,
        ),
        (
            "loopx",
            format!("--crate-name loopx --crate-type bin {linux}"),
            has_libc_a,
        ),
        (
            "loopx",
            format!("--crate-name loopx --crate-type lib {linux}"),
            false,
        ),
        ("loopx", format!("--crate-name loopx --test {linux}"), false),
        (
            "loopx",
            format!("--crate-name loopx_wasm --crate-type bin {linux}"),
            false,
        ),
        (
            "loopx",
            "--crate-name loopx --crate-type bin --target aarch64-apple-darwin".into(),
            false,
        ),
        (
            "loopx",
            "--crate-name loopx --crate-type bin --target aarch64-unknown-linux-gnu".into(),
            false,
        ),
        (
            "serde",
            format!("--crate-name serde --crate-type bin {linux}"),
            false,
        ),
    ] {
        let want = if gets_flags {
            format!("{args}{flags}")
        } else {
            args.clone()
        };
        assert_eq!(run(package, &args, None).0, want, "{package}: {args}");
    }
    // Without glibc's libc.a it warns and links dynamically.
    let dir = tempfile::tempdir().unwrap();
    let cc = dir.path().join("cc");
    std::fs::write(&cc, "#!/bin/sh\necho libc.a\n").unwrap();
    std::fs::set_permissions(&cc, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap()
    );
    let args = format!("--crate-name loopx --crate-type bin {linux}");
    let (echoed, warning) = run("loopx", &args, Some(&path));
    assert_eq!(echoed, args);
    assert!(warning.contains("libc.a not found"), "{warning}");
}

/// What a repeated resolution or release says is what happened: the same decision again changes
/// nothing and says so; the other decision is refused (a resolution is final); releasing a todo
/// nobody holds releases nothing; a fence never granted is named as such, not as "stale".
#[test]
fn repeats_report_what_happened() {
    let p = Project::new();
    let g = p.goal("repeats");
    let gate = p.add_todo(&g, "gate", &["--kind", "user_gate", "--global-gate"]);
    p.json(&[
        "gate",
        "resolve",
        "--goal-id",
        &g,
        "--todo-id",
        &gate,
        "--reject",
    ]);
    let again = p.ok(&[
        "gate",
        "resolve",
        "--goal-id",
        &g,
        "--todo-id",
        &gate,
        "--reject",
    ]);
    assert!(
        again.stdout.contains("rejected already: nothing changed"),
        "{}",
        again.stdout
    );
    let before = p.snapshot();
    let r = p.run(&["gate", "resolve", "--goal-id", &g, "--todo-id", &gate]);
    assert_eq!(r.code, 4, "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("already rejected"), "{}", r.stderr);
    assert_eq!(before, p.snapshot());

    let t = p.add_todo(&g, "work", &[]);
    let r = p.json(&[
        "todo",
        "release",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--agent-id",
        "zzz",
        "--fence",
        "99",
    ]);
    assert_eq!(r["changed"], false);
    let r = p.ok(&[
        "todo",
        "release",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--agent-id",
        "zzz",
        "--fence",
        "99",
    ]);
    assert!(r.stdout.contains("nothing released"), "{}", r.stdout);

    let claim = p.json(&[
        "todo",
        "claim",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--agent-id",
        "a1",
    ]);
    assert_eq!(claim["claim"]["fence"], 1);
    let r = p.run(&[
        "todo",
        "release",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--agent-id",
        "a1",
        "--fence",
        "2",
    ]);
    assert_eq!(r.code, 4, "{}", r.stderr);
    assert!(r.stderr.contains("never granted"), "{}", r.stderr);
    let r = p.json(&[
        "todo",
        "release",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--agent-id",
        "a1",
        "--fence",
        "1",
    ]);
    assert_eq!(r["changed"], true);
}

/// Closing a goal is final: it takes no new todos or monitors, none of its todos reopens or
/// changes plan, no monitor check or provider probe runs, and each refusal leaves the store as it
/// was. What is left can still be completed or archived, with evidence.
#[test]
fn a_closed_goal_takes_no_new_or_reopened_work() {
    let p = Project::new();
    let goal = p.goal("g");
    let open = p.add_todo(&goal, "left open", &[]);
    let other = p.add_todo(&goal, "also left", &[]);
    let monitor = p.add_todo(&goal, "watch", &["--kind", "monitor", "--every", "1h"]);
    p.json(&["goal", "close", "--goal-id", &goal]);
    let before = p.db_dump(None);
    // `todo VERB --goal-id g REST...` and the like.
    let on_goal = |verb: [&'static str; 2], rest: &[&str]| -> Vec<String> {
        [&verb[..], &["--goal-id", &goal], rest]
            .concat()
            .into_iter()
            .map(str::to_owned)
            .collect()
    };
    let refused = [
        on_goal(["todo", "add"], &["--title", "more work"]),
        on_goal(
            ["todo", "add"],
            &["--title", "m", "--kind", "monitor", "--every", "1h"],
        ),
        on_goal(
            ["todo", "update"],
            &["--todo-id", &open, "--status", "blocked"],
        ),
        on_goal(
            ["todo", "update"],
            &["--todo-id", &open, "--title", "renamed"],
        ),
        on_goal(
            ["todo", "update"],
            &["--todo-id", &open, "--priority", "P0"],
        ),
        on_goal(
            ["todo", "update"],
            &["--todo-id", &monitor, "--every", "2h"],
        ),
        on_goal(
            ["todo", "check"],
            &["--todo-id", &monitor, "--observation", "v=1"],
        ),
        on_goal(
            ["probe", "set"],
            &[
                "--provider",
                "ext/p",
                "--operation",
                "read",
                "--target",
                "x",
            ],
        ),
    ];
    for args in &refused {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = p.run(&args);
        assert_eq!(run.code, 1, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains("goal 'g' is closed"),
            "{args:?}: {}",
            run.stderr
        );
        assert_eq!(p.db_dump(None), before, "{args:?} changed the store");
    }
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &goal,
        "--todo-id",
        &open,
        "--evidence",
        "what was found",
    ]);
    p.json(&["todo", "complete", "--goal-id", &goal, "--todo-id", &open]);
    p.json(&[
        "todo",
        "update",
        "--goal-id",
        &goal,
        "--todo-id",
        &other,
        "--status",
        "archived",
    ]);
    let todos = p.json(&["todo", "list", "--goal-id", &goal])["todos"].clone();
    let status = |id: &str| {
        todos
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .map(|t| t["status"].clone())
    };
    assert_eq!(status(&open), Some("completed".into()));
    assert_eq!(status(&other), Some("archived".into()));
}

/// Run ids follow the order of commits, not the clock's: after the clock is set back (here by an
/// hour), the next tick's run is still the newest in history and `spend-slot` charges it,
/// instead of finding the earlier, future-dated run again and replaying its spend.
#[test]
fn a_clock_set_back_neither_reorders_history_nor_replays_a_spend() {
    let p = Project::new();
    let goal = p.goal("g");
    let clock = p.state().join("test-clock-offset-ms");
    let tick = |summary: &str| {
        let run = p.json(&["refresh-state", "--goal-id", &goal, "--summary", summary]);
        let spend = p.json(&["quota", "spend-slot", "--goal-id", &goal]);
        (run["run_id"].as_str().unwrap().to_string(), spend)
    };
    std::fs::write(&clock, "3600000").unwrap();
    let (ahead, first) = tick("tick 1");
    assert_eq!(first["appended"], true, "{first}");
    std::fs::remove_file(&clock).unwrap();
    let (corrected, second) = tick("tick 2");
    assert!(corrected > ahead, "{corrected} sorts after {ahead}");
    assert_eq!(second["appended"], true, "{second}");
    assert_eq!(second["idempotent_replay"], false, "{second}");
    assert_eq!(second["after"]["spent_slots"], 2, "{second}");
    let history = p.json(&["history", "--goal-id", &goal, "--limit", "1"]);
    assert_eq!(
        history["runs"][0]["run_id"],
        corrected.as_str(),
        "{history}"
    );
    assert_eq!(history["runs"][0]["summary"], "tick 2", "{history}");
    // The spend dated an hour ahead counts in the window, and the plot's spans still sum to it.
    let quota = p.json(&["quota", "show", "--goal-id", &goal]);
    let spans: i64 = quota["spend_series"]["net_slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_i64().unwrap())
        .sum();
    assert_eq!(quota["quota"]["spent_slots"], 2, "{quota}");
    assert_eq!(spans, 2, "{quota}");
}

/// The queue names, per goal, exactly the capabilities that goal's live todos need and nobody
/// provides; a goal without bound todos (read before any other, so the registry is not yet
/// read when the next goal needs it) gets no repair item.
#[test]
fn the_attention_queue_names_each_goals_missing_capabilities() {
    let p = Project::new();
    let plain = p.goal("plain");
    p.add_todo(&plain, "ordinary work", &[]);
    let needs = p.goal("needs");
    p.add_todo(&needs, "fix it", &["--capability", "missing-ext/fixer"]);
    let also = p.goal("also");
    p.add_todo(&also, "lint it", &["--capability", "other-ext/lint"]);
    p.add_todo(&also, "fix it too", &["--capability", "missing-ext/fixer"]);
    let status = p.json(&["status"]);
    let mut repairs: Vec<(String, String)> = status["attention"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "repair")
        .map(|i| {
            (
                i["goal_id"].as_str().unwrap().to_string(),
                i["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    repairs.sort();
    assert_eq!(
        repairs,
        [
            (
                also.clone(),
                "missing-ext/fixer, other-ext/lint".to_string()
            ),
            (needs.clone(), "missing-ext/fixer".to_string()),
        ],
        "{status}"
    );
    for (g, repair) in [(&plain, false), (&needs, true), (&also, true)] {
        let d = p.json(&["quota", "should-run", "--goal-id", g]);
        assert_eq!(d["route"] == "repair_required", repair, "{g}: {d}");
    }
}

/// An agent that lost the answer to its completion runs the same command again, proof
/// included: the answer is the completion's (`changed: false`, exit 0), and the repeat writes
/// nothing, not even its evidence a second time.
#[test]
fn a_completion_repeated_with_its_lease_proof_is_answered_unchanged() {
    let p = Project::new();
    let g = p.goal("retry");
    let t = p.add_todo(&g, "work", &[]);
    p.json(&[
        "todo",
        "claim",
        "--goal-id",
        &g,
        "--todo-id",
        &t,
        "--agent-id",
        "a",
        "--idempotency-key",
        "kk",
    ]);
    let complete = |proof: &[&str]| {
        let head = [
            "todo",
            "complete",
            "--goal-id",
            &g,
            "--todo-id",
            &t,
            "--agent-id",
            "a",
            "--evidence",
            "done",
        ];
        p.json(&[&head[..], proof].concat())
    };
    for proof in [
        &["--claim-key", "kk"][..],
        &["--claim-key", "kk"],
        &["--fence", "1"],
    ] {
        let r = complete(proof);
        assert_eq!(r["todo"]["status"], "completed", "{r}");
    }
    let before = p.snapshot();
    let r = complete(&["--claim-key", "kk"]);
    assert_eq!(r["changed"], false, "{r}");
    assert_eq!(before, p.snapshot(), "a repeat wrote");
    let shown = p.json(&["todo", "show", "--goal-id", &g, "--todo-id", &t]);
    assert_eq!(shown["evidence"].as_array().unwrap().len(), 1, "{shown}");
}
