//! `loopx loop`: two agents looping on one goal in parallel never work the same todo; a user gate
//! stops exactly the agents it scopes; SIGTERM settles the turn in flight and stops the loop.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::support::{Project, turn_run, wait_for};
use serde_json::Value;

/// Host: logs "<agent> <todo>", works a little, completes its todo.
const WORKER: &str = r#"cat >/dev/null
echo "$LOOPX_AGENT_ID $LOOPX_TODO_ID" >> work.log
sleep 0.2
printf '{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"did %s","evidence":[{"text":"%s by %s"}]}' "$LOOPX_TODO_ID" "$LOOPX_TODO_ID" "$LOOPX_AGENT_ID"
"#;

fn loop_args<'a>(agent: &'a str, host: &'a str) -> Vec<&'a str> {
    vec![
        "--format",
        "json",
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        agent,
        "--max-turns",
        "20",
        "--until-idle",
        "--trust-host-completion",
        "--timeout-seconds",
        "30",
        "--",
        host,
    ]
}

fn finish(child: std::process::Child) -> (Value, String) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "loop failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn work_log(p: &Project) -> Vec<(String, String)> {
    std::fs::read_to_string(p.file("work.log"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut it = l.split(' ');
            (
                it.next().unwrap().to_string(),
                it.next().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn two_agents_never_work_the_same_todo() {
    let p = Project::with_goal_g();
    let ids: Vec<String> = (1..=10).map(|i| format!("t{i}")).collect();
    for id in &ids {
        p.add_work(id);
    }
    // t10 waits for t1: the loop that finishes early must wait for it instead of quitting.
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--id",
        "t11",
        "--title",
        "after t1",
        "--depends-on",
        "t1",
    ]);
    let host = p.script("worker.sh", WORKER);
    let a1 = p.spawn(&loop_args("a1", &host));
    let a2 = p.spawn(&loop_args("a2", &host));
    let (r1, err1) = finish(a1);
    let (r2, _) = finish(a2);
    let log = work_log(&p);
    let mut seen = HashSet::new();
    for (agent, todo) in &log {
        assert!(
            seen.insert(todo.clone()),
            "{todo} worked twice (again by {agent}): {log:?}"
        );
    }
    let mut want: HashSet<String> = ids.iter().cloned().collect();
    want.insert("t11".into());
    assert_eq!(seen, want, "every todo worked exactly once");
    for id in &want {
        assert_eq!(p.todo_status(id), "completed", "{id}");
    }
    let per_agent: HashMap<&str, usize> = log.iter().fold(HashMap::new(), |mut m, (a, _)| {
        *m.entry(a.as_str()).or_default() += 1;
        m
    });
    assert!(
        per_agent.get("a1").copied().unwrap_or(0) >= 1,
        "{per_agent:?}"
    );
    assert!(
        per_agent.get("a2").copied().unwrap_or(0) >= 1,
        "{per_agent:?}"
    );
    let turns = r1["loop"]["turns"].as_array().unwrap().len()
        + r2["loop"]["turns"].as_array().unwrap().len();
    assert_eq!(turns, 11);
    assert_eq!(p.spends().len(), 11);
    for r in [&r1, &r2] {
        assert_eq!(r["loop"]["final_disposition"], "replan", "{r}");
        // Healthy loops never settle (or claim to settle) each other's live turns.
        for t in r["loop"]["turns"].as_array().unwrap() {
            assert_eq!(t["recovered"], false, "{t}");
            assert_eq!(t["recovered_turns"], serde_json::json!([]), "{t}");
        }
    }
    // One progress line per turn on stderr.
    assert!(err1.lines().any(|l| l.starts_with("turn 1/20 t")), "{err1}");
}

#[test]
fn a_gate_scoped_to_one_agent_stops_only_that_agent() {
    let p = Project::with_goal_g();
    for i in 1..=4 {
        p.add_work(&format!("t{i}"));
    }
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
        "review a1's plan",
    ]);
    let host = p.script("worker.sh", WORKER);
    let a1 = p.spawn(&loop_args("a1", &host));
    let a2 = p.spawn(&loop_args("a2", &host));
    let (r1, _) = finish(a1);
    let (r2, _) = finish(a2);
    assert_eq!(r1["loop"]["turns"].as_array().unwrap().len(), 0);
    assert_eq!(r1["loop"]["final_disposition"], "user_action_required");
    assert_eq!(r2["loop"]["turns"].as_array().unwrap().len(), 4);
    assert!(work_log(&p).iter().all(|(a, _)| a == "a2"));
    for i in 1..=4 {
        assert_eq!(p.todo_status(&format!("t{i}")), "completed");
    }
}

#[test]
fn a_global_gate_stops_every_agent() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.ok(&[
        "todo",
        "add",
        "--goal-id",
        "g",
        "--kind",
        "user_gate",
        "--global-gate",
        "--title",
        "hold everything",
    ]);
    let host = p.script("worker.sh", WORKER);
    let a1 = p.spawn(&loop_args("a1", &host));
    let a2 = p.spawn(&loop_args("a2", &host));
    for r in [finish(a1).0, finish(a2).0] {
        assert_eq!(r["loop"]["turns"].as_array().unwrap().len(), 0);
        assert_eq!(r["loop"]["final_disposition"], "user_action_required");
    }
    assert!(work_log(&p).is_empty());
    assert_eq!(p.todo_status("t1"), "open");
}

#[test]
fn a_host_asking_for_an_operator_opens_a_gate_for_its_agent_only() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    let host = p.script(
        "ask.sh",
        r#"cat >/dev/null
printf '{"schema_version":"loopx.turn_result.v1","status":"user_action_required","summary":"need credentials for the staging database"}'
"#,
    );
    let (r, _) = finish(p.spawn(&loop_args("a1", &host)));
    let turns = r["loop"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1);
    assert_eq!(turns[0]["kind"], "user_action_required");
    assert_eq!(turns[0]["status"], "stopped");
    assert_eq!(turns[0]["spent"], false);
    assert_eq!(r["loop"]["final_disposition"], "user_action_required");
    let gates = p.json(&["gate", "list", "--goal-id", "g"]);
    let text = gates.to_string();
    assert!(text.contains("need credentials"), "{text}");
    assert_eq!(
        p.json(&["turn", "plan", "--goal-id", "g", "--agent-id", "a1"])["plan"]["route"],
        "user_action_required"
    );
    assert_eq!(
        p.json(&["turn", "plan", "--goal-id", "g", "--agent-id", "a2"])["plan"]["route"],
        "ready_for_host"
    );
    assert!(p.spends().is_empty());
}

#[test]
fn the_budget_bounds_the_loop() {
    let p = Project::with_goal_g();
    for i in 1..=5 {
        p.add_work(&format!("t{i}"));
    }
    let host = p.script("worker.sh", WORKER);
    let out = p.json(&[
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--max-turns",
        "2",
        "--until-idle",
        "--trust-host-completion",
        "--",
        &host,
    ]);
    assert_eq!(out["loop"]["turns"].as_array().unwrap().len(), 2);
    assert_eq!(out["loop"]["final_disposition"], "terminal");
    assert_eq!(p.spends().len(), 2);
}

#[test]
fn repeated_failures_stop_the_loop_with_repair() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script("fail.sh", "cat >/dev/null\nexit 1\n");
    let out = p.json(&[
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--max-turns",
        "10",
        "--until-idle",
        "--max-consecutive-failures",
        "2",
        "--",
        &host,
    ]);
    let turns = out["loop"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "one retry, then repair");
    assert!(turns.iter().all(|t| t["kind"] == "host_failure"));
    assert_eq!(out["loop"]["final_disposition"], "repair");
    assert_eq!(p.todo_status("t1"), "open");
}

#[test]
fn sigint_settles_the_turn_in_flight_and_stops() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    // `host.finished` exists only if the host ran to its end: the interrupt must cut it short.
    let host = p.script(
        "slow.sh",
        "cat >/dev/null\necho $$ > host.pid\nsleep 30\ntouch host.finished\n",
    );
    let child = p.spawn(&[
        "--format",
        "json",
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--max-turns",
        "5",
        "--",
        &host,
    ]);
    let pid_file = p.file("host.pid");
    wait_for(
        "the first turn's host to start",
        Duration::from_secs(30),
        || std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n')),
    );
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        !p.file("host.finished").exists(),
        "the loop let the host run to its end instead of stopping it"
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["loop"]["interrupted"], true);
    let turns = v["loop"]["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 1, "no new turn after the signal");
    assert_eq!(turns[0]["kind"], "host_failure");
    assert_eq!(turns[0]["status"], "failed");
    let left = crate::support::wait_until_gone(p.path(), Duration::from_secs(2));
    assert!(left.is_empty(), "the host survived the interrupt: {left:?}");
    assert_eq!(p.todo_status("t1"), "open", "lease released");
    assert!(
        p.json(&["turn", "recover"])["turns"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// An agent that crashed mid-turn holds the only todo's lease; another agent's loop settles the
/// orphaned turn (releasing the lease) instead of waiting for the lease to expire.
#[test]
fn a_waiting_loop_settles_a_crashed_agents_turn() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script("worker.sh", WORKER);
    let crashed = p
        .command(&turn_run("a1", &[], &[&host]))
        .env("LOOPX_TEST_CRASH_AFTER", "start")
        .output()
        .unwrap();
    assert!(!crashed.status.success());
    assert_eq!(p.todo_status("t1"), "claimed");
    let mut a2 = p.spawn(&loop_args("a2", &host));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = a2.try_wait().unwrap() {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = a2.kill();
            panic!("a2 kept waiting on the dead agent's lease");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success());
    assert_eq!(p.todo_status("t1"), "completed");
    assert_eq!(work_log(&p), vec![("a2".to_string(), "t1".to_string())]);
}

/// Host: logs "<agent> <todo>", works long enough for a second turn to overlap it, completes.
const SLOW_WORKER: &str = r#"cat >/dev/null
echo "$LOOPX_AGENT_ID $LOOPX_TODO_ID" >> work.log
sleep 0.4
printf '{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"did %s","evidence":[{"text":"%s by %s"}]}' "$LOOPX_TODO_ID" "$LOOPX_TODO_ID" "$LOOPX_AGENT_ID"
"#;

/// Two overlapping `turn run` of the same agent (a cron tick overlapping the previous one):
/// the lease is worked by one turn, the other exits 4 (or finds nothing to do) and never runs
/// its host; one evidence row and one spend per accepted turn, over many rounds.
#[test]
fn overlapping_turns_of_one_agent_run_the_host_once_per_lease() {
    let p = Project::with_goal_g();
    let host = p.script("slow.sh", SLOW_WORKER);
    let rounds = 6;
    let mut refused = 0;
    for round in 1..=rounds {
        let todo = format!("t{round}");
        p.add_work(&todo);
        let args = turn_run("a1", &["--trust-host-completion"], &[&host]);
        let first = p.spawn(&args);
        let second = p.spawn(&args);
        let codes: Vec<i32> = [first, second]
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .map(|o| {
                let code = o.status.code().unwrap_or(-1);
                assert!(
                    code == 0 || code == 4,
                    "round {round}: exit {code}: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                if code == 4 {
                    let err = String::from_utf8_lossy(&o.stderr);
                    assert!(err.contains("one turn works a lease"), "{err}");
                }
                code
            })
            .collect();
        refused += codes.iter().filter(|c| **c == 4).count();
        let runs_of_todo = work_log(&p).iter().filter(|(_, t)| *t == todo).count();
        assert_eq!(
            runs_of_todo, 1,
            "round {round}: the host ran {runs_of_todo} times"
        );
        assert_eq!(p.evidence_count(&todo), 1, "round {round}");
        assert_eq!(p.todo_status(&todo), "completed", "round {round}");
        assert_eq!(p.spends().len(), round, "round {round}: one spend per turn");
    }
    // The hosts overlap by 0.4 s: most rounds race, and a race is refused with exit 4.
    assert!(
        refused >= rounds / 2,
        "only {refused} of {rounds} rounds overlapped"
    );
}

/// `--allowed-slots` holds with parallel loops of different agents, and `--per-agent-cap` with
/// parallel turns of one agent on different todos: a turn reserves its slot in the transaction
/// that starts it, so the check and the spend never interleave with another turn's.
#[test]
fn quota_limits_hold_under_parallel_turns() {
    for round in 1..=3 {
        let p = Project::with_goal_g();
        for i in 1..=12 {
            p.add_work(&format!("t{i}"));
        }
        p.ok(&["quota", "set", "--goal-id", "g", "--allowed-slots", "3"]);
        let host = p.script("slow.sh", SLOW_WORKER);
        let agents: Vec<String> = (1..=6).map(|i| format!("a{i}")).collect();
        let loops: Vec<_> = agents
            .iter()
            .map(|a| p.spawn(&loop_args(a, &host)))
            .collect();
        for l in loops {
            finish(l);
        }
        let spent = p.spent_slots();
        let ran = work_log(&p).len();
        assert!(
            spent <= 3,
            "round {round}: {spent} slots spent with 3 allowed"
        );
        assert_eq!(ran as i64, spent, "round {round}: one host run per spend");
    }
    for round in 1..=3 {
        let p = Project::with_goal_g();
        for i in 1..=4 {
            p.add_work(&format!("t{i}"));
        }
        p.ok(&["quota", "set", "--goal-id", "g", "--per-agent-cap", "2"]);
        let host = p.script("slow.sh", SLOW_WORKER);
        let turns: Vec<_> = (1..=4)
            .map(|i| {
                let todo = format!("t{i}");
                p.spawn(&turn_run(
                    "a1",
                    &["--todo-id", &todo, "--trust-host-completion"],
                    &[&host],
                ))
            })
            .collect();
        for t in turns {
            let out = t.wait_with_output().unwrap();
            let code = out.status.code().unwrap_or(-1);
            assert!(
                code == 0 || code == 4,
                "round {round}: exit {code}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let spent = p.spent_slots();
        assert!(
            spent <= 2,
            "round {round}: {spent} slots spent with a cap of 2"
        );
        assert_eq!(work_log(&p).len() as i64, spent, "round {round}");
    }
}

/// The README's loop with a host that claims `completed` and no validator: the loop stops with
/// `no_validated_progress` after the default three unproven turns on the todo, not after ten.
#[test]
fn unvalidated_claims_on_one_todo_stop_the_loop() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script(
        "claims.sh",
        r#"cat >/dev/null
echo "$LOOPX_AGENT_ID $LOOPX_TODO_ID" >> work.log
printf '{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"said so"}'
"#,
    );
    let out = p.json(&["loop", "--goal-id", "g", "--agent-id", "a1", "--", &host]);
    let report = &out["loop"];
    assert_eq!(report["final_disposition"], "no_validated_progress");
    assert_eq!(report["turns"].as_array().unwrap().len(), 3);
    assert!(
        report["stop_reason"]
            .as_str()
            .unwrap()
            .contains("--validate-json"),
        "{report}"
    );
    assert_eq!(p.spent_slots(), 3);
    assert_eq!(p.todo_status("t1"), "open");

    // A validator that passes proves each turn: the loop keeps going on the same todo.
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = p.script(
        "progress.sh",
        r#"cat >/dev/null
printf '{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"step"}'
"#,
    );
    let out = p.json(&[
        "loop",
        "--goal-id",
        "g",
        "--agent-id",
        "a1",
        "--max-turns",
        "5",
        "--validate-json",
        r#"["true"]"#,
        "--",
        &host,
    ]);
    assert_eq!(out["loop"]["final_disposition"], "terminal");
    assert_eq!(out["loop"]["turns"].as_array().unwrap().len(), 5);
}
