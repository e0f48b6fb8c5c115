//! `loopx turn plan`: the route before any host runs, with its reason and selected todo, and no
//! writes.

use crate::support::{Project, result_host, turn_run};

fn plan(p: &Project, agent: &str) -> serde_json::Value {
    p.json(&["turn", "plan", "--goal-id", "g", "--agent-id", agent])["plan"].clone()
}

#[test]
fn routes_follow_the_goal_state() {
    let p = Project::with_goal_g();
    // No todos at all: replan.
    assert_eq!(plan(&p, "a1")["route"], "replan_required");

    p.add_work("t1");
    let ready = plan(&p, "a1");
    assert_eq!(ready["route"], "ready_for_host");
    assert_eq!(ready["selected_todo"]["id"], "t1");
    assert!(ready["reason"].as_str().unwrap().contains("t1"));

    // Planning wrote nothing: no row of any table changed (the todo is still open and unclaimed,
    // no operation logged, no turn journaled).
    let before = p.db_dump(None);
    plan(&p, "a1");
    assert_eq!(p.db_dump(None), before);
    assert_eq!(p.todo_status("t1"), "open");

    // Someone else holds the only todo: wait.
    p.ok(&Project::todo_args("claim", "g", "t1", "a2", &[]));
    assert_eq!(plan(&p, "a1")["route"], "wait");
    // ...and the holder is told to continue it.
    let held = plan(&p, "a2");
    assert_eq!(held["route"], "ready_for_host");
    assert_eq!(held["selected_todo"]["selected_by"], "current_claim");

    // A gate scoped to a1 stops a1 only.
    p.add_work("t2");
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--kind",
        "user_gate",
        "--blocks-agent",
        "a1",
        "--title",
        "approve a1",
    ]);
    assert_eq!(plan(&p, "a1")["route"], "user_action_required");
    assert_eq!(plan(&p, "a3")["route"], "ready_for_host");

    // A paused goal blocks everyone.
    p.ok(&["goal", "pause", "--goal-id", "g"]);
    assert_eq!(plan(&p, "a3")["route"], "blocked");
}

#[test]
fn a_turn_on_a_non_ready_route_runs_no_host() {
    let p = Project::with_goal_g();
    let host = p.script("host.sh", "touch ran\n");
    let out = p.json(&turn_run("a1", &[], &[&host]));
    assert_eq!(out["turn"]["route"], "replan_required");
    assert!(out["turn"]["kind"].is_null());
    assert!(out["turn"]["turn_key"].is_null());
    assert!(!p.file("ran").exists());
    assert!(p.history().is_empty());
}

/// A named turn key makes `turn run` idempotent: the retry replays the stored result (the host
/// does not run again, nothing is spent twice); `inspect` of an unknown key is exit 3.
#[test]
fn named_turn_keys_replay_and_unknown_keys_are_not_found() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    let host = p.script("host.sh", &result_host("progress"));
    let args = turn_run("a1", &["--turn-key", "deploy-step-1"], &[&host]);
    let first = p.json(&args);
    assert_eq!(first["turn"]["turn_key"], "deploy-step-1");
    assert_eq!(first["turn"]["replayed"], false);
    let second = p.json(&args);
    assert_eq!(second["turn"]["replayed"], true);
    assert_eq!(second["turn"]["kind"], first["turn"]["kind"]);
    assert_eq!(second["turn"]["run_id"], first["turn"]["run_id"]);
    assert_eq!(p.hosts_log().len(), 1);
    assert_eq!(p.spends(), vec!["turn:deploy-step-1".to_string()]);
    // The key belongs to a1 on g: another agent cannot reuse it.
    let other = p.run(&turn_run("a2", &["--turn-key", "deploy-step-1"], &[&host]));
    assert_eq!(other.code, 4);
    let missing = p.run(&["turn", "inspect", "--turn-key", "turn-nope"]);
    assert_eq!(missing.code, 3);
    assert!(
        p.json(&["turn", "recover"])["turns"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}
