//! Lease races between real processes: exactly one winner per todo, never a double grant, and a
//! superseded holder cannot write with its old fence or claim key, whether the new lease went to
//! another agent or to the same one.

use std::collections::HashMap;
use std::sync::{Arc, Barrier};

use crate::support::{Project, to_run};

#[test]
fn sixteen_processes_claiming_one_todo_yield_exactly_one_winner() {
    let p = Project::new();
    let g = p.goal("race");
    let t = p.add_todo(&g, "the one todo", &[]);
    let barrier = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let mut cmd = p.command(&[
                "--format",
                "json",
                "todo",
                "claim",
                "--goal-id",
                &g,
                "--todo-id",
                &t,
                "--agent-id",
                &format!("agent-{i}"),
            ]);
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                to_run(cmd.output().expect("spawn"))
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners: Vec<_> = results.iter().filter(|r| r.code == 0).collect();
    let losers: Vec<_> = results.iter().filter(|r| r.code == 4).collect();
    assert_eq!(winners.len(), 1, "exactly one winner: {results:#?}");
    assert_eq!(
        losers.len(),
        15,
        "every other claimer gets the conflict exit code 4: {results:#?}"
    );
    for l in &losers {
        assert!(
            l.stderr.contains("is claimed by agent"),
            "loser message names the holder: {}",
            l.stderr
        );
    }
    let winner = winners[0].json();
    assert_eq!(winner["claim"]["fence"], 1);
    let listed = p.json(&["todo", "list", "--goal-id", &g]);
    assert_eq!(
        listed["todos"][0]["claim"]["agent_id"],
        winner["claim"]["agent_id"]
    );
}

#[test]
fn sixteen_processes_claiming_next_ready_never_grant_a_todo_twice() {
    let p = Project::new();
    let g = p.goal("pool");
    for i in 0..100 {
        p.add_todo(
            &g,
            &format!("item {i}"),
            &["--priority", ["P0", "P1", "P2"][i % 3]],
        );
    }
    let barrier = Arc::new(Barrier::new(16));
    let root = p.path().to_path_buf();
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let barrier = barrier.clone();
            let root = root.clone();
            let g = g.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut granted = Vec::new();
                for n in 0.. {
                    let out = std::process::Command::new(crate::support::loopx_bin())
                        .args([
                            "--format",
                            "json",
                            "todo",
                            "claim",
                            "--goal-id",
                            &g,
                            "--agent-id",
                            &format!("w{i}-{n}"),
                        ])
                        .current_dir(&root)
                        .env_remove("LOOPX_AGENT_ID")
                        .output()
                        .expect("spawn");
                    let run = to_run(out);
                    match run.code {
                        0 => {
                            let v = run.json();
                            granted.push((
                                v["todo"]["id"].as_str().unwrap().to_string(),
                                v["claim"]["fence"].as_i64().unwrap(),
                            ));
                        }
                        3 => break,
                        other => panic!("unexpected exit {other}: {} {}", run.stdout, run.stderr),
                    }
                }
                granted
            })
        })
        .collect();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for h in handles {
        for (todo, fence) in h.join().unwrap() {
            assert_eq!(fence, 1, "first grant of {todo} has fence 1");
            *seen.entry(todo).or_default() += 1;
        }
    }
    assert_eq!(seen.len(), 100, "every todo granted");
    assert!(
        seen.values().all(|&n| n == 1),
        "a todo was granted twice: {seen:?}"
    );
}

#[test]
fn expired_holder_cannot_complete_after_takeover() {
    let p = Project::new();
    let g = p.goal("lease");
    let t = p.add_todo(&g, "slow work", &[]);
    let first = p.json(&Project::todo_args(
        "claim",
        &g,
        &t,
        "slow",
        &["--ttl-seconds", "1", "--idempotency-key", "slow-1"],
    ));
    assert_eq!(first["claim"]["fence"], 1);
    // While the lease is live, another agent is refused.
    assert_eq!(
        p.run(&Project::todo_args("claim", &g, &t, "fast", &[]))
            .code,
        4
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let second = p.json(&Project::todo_args("claim", &g, &t, "fast", &[]));
    assert_eq!(second["claim"]["fence"], 2);
    assert_eq!(second["claim"]["took_over_from"], "slow");

    let stale_fence = p.run(&Project::todo_args(
        "complete",
        &g,
        &t,
        "slow",
        &["--fence", "1", "--evidence", "late"],
    ));
    assert_eq!(stale_fence.code, 4, "{}", stale_fence.stderr);
    assert!(
        stale_fence.stderr.contains("claimed by agent 'fast'"),
        "{}",
        stale_fence.stderr
    );
    let stale_key = p.run(&Project::todo_args(
        "complete",
        &g,
        &t,
        "slow",
        &["--claim-key", "slow-1"],
    ));
    assert_eq!(stale_key.code, 4);
    // The old holder's renew is refused too (the lease is another agent's; the same agent
    // re-granted is `the_same_agent_with_a_stale_fence_or_key_is_refused_after_a_re_grant`).
    let renew = p.run(&Project::todo_args(
        "renew",
        &g,
        &t,
        "slow",
        &["--fence", "1"],
    ));
    assert_eq!(renew.code, 4);

    let todo = p.json(&["todo", "show", "--goal-id", &g, "--todo-id", &t]);
    assert_eq!(todo["todo"]["status"], "claimed");
    assert_eq!(
        todo["evidence"].as_array().unwrap().len(),
        0,
        "the stale write left no evidence"
    );

    p.json(&Project::todo_args(
        "complete",
        &g,
        &t,
        "fast",
        &["--fence", "2", "--evidence", "done"],
    ));
    assert_eq!(
        p.json(&["todo", "show", "--goal-id", &g, "--todo-id", &t])["todo"]["status"],
        "completed"
    );
}

#[test]
fn holder_write_needs_current_proof_and_same_agent_same_key_replays() {
    let p = Project::new();
    let g = p.goal("proof");
    let t = p.add_todo(&g, "work", &[]);
    let c = p.json(&Project::todo_args(
        "claim",
        &g,
        &t,
        "a1",
        &["--idempotency-key", "k1"],
    ));
    let again = p.json(&Project::todo_args(
        "claim",
        &g,
        &t,
        "a1",
        &["--idempotency-key", "k1"],
    ));
    assert_eq!(again["claim"]["replayed"], true);
    assert_eq!(again["claim"]["fence"], c["claim"]["fence"]);
    // No proof: refused with the conflict code and a hint.
    let r = p.run(&Project::todo_args(
        "update",
        &g,
        &t,
        "a1",
        &["--evidence", "x"],
    ));
    assert_eq!(r.code, 4);
    assert!(r.stderr.contains("--fence"), "{}", r.stderr);
    // Another agent: refused.
    assert_eq!(
        p.run(&Project::todo_args(
            "update",
            &g,
            &t,
            "a2",
            &["--fence", "1", "--evidence", "x"]
        ))
        .code,
        4
    );
    // The holder with the key from the environment (as the turn driver provides it).
    let ok = p.run_env(
        &[
            "todo",
            "update",
            "--goal-id",
            &g,
            "--todo-id",
            &t,
            "--evidence",
            "progress",
        ],
        &[("LOOPX_AGENT_ID", "a1"), ("LOOPX_CLAIM_KEY", "k1")],
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    // Release returns it to the pool; the old proof is then stale.
    p.json(&Project::todo_args(
        "release",
        &g,
        &t,
        "a1",
        &["--claim-key", "k1"],
    ));
    assert_eq!(
        p.run(&Project::todo_args(
            "complete",
            &g,
            &t,
            "a1",
            &["--claim-key", "k1"]
        ))
        .code,
        4
    );
    let next = p.json(&["todo", "claim", "--goal-id", &g, "--agent-id", "a2"]);
    assert_eq!(
        next["claim"]["fence"], 2,
        "fences never repeat after a release"
    );
}

/// The same agent holds a stale proof after its todo was granted again, to itself: released and
/// re-claimed, then expired and re-claimed. The agent id matches, so only the fence or key check
/// can refuse the old proof; each refusal names that check, and nothing is written.
#[test]
fn the_same_agent_with_a_stale_fence_or_key_is_refused_after_a_re_grant() {
    let p = Project::new();
    let g = p.goal("regrant");
    let t = p.add_todo(&g, "work", &[]);
    let args = |verb, extra| Project::todo_args(verb, &g, &t, "a1", extra);
    let c1 = p.json(&args("claim", &["--idempotency-key", "k1"]));
    assert_eq!(c1["claim"]["fence"], 1);
    p.json(&args("release", &["--claim-key", "k1"]));
    let c2 = p.json(&args(
        "claim",
        &["--idempotency-key", "k2", "--ttl-seconds", "1"],
    ));
    assert_eq!(c2["claim"]["fence"], 2);

    // Refusals of the proofs of lease 1 while the same agent holds lease 2.
    let refused = |r: crate::support::Run, needle: &str| {
        assert_eq!(r.code, 4, "{needle}: {}", r.stderr);
        assert!(r.stderr.contains(needle), "{needle}: {}", r.stderr);
    };
    let before = p.db_dump(None);
    refused(
        p.run(&args("complete", &["--fence", "1", "--evidence", "late"])),
        "stale fence 1",
    );
    refused(
        p.run(&args(
            "update",
            &["--claim-key", "k1", "--evidence", "late"],
        )),
        "claim key 'k1' is not the current lease",
    );
    refused(p.run(&args("renew", &["--fence", "1"])), "stale fence 1");
    refused(
        p.run(&args("release", &["--claim-key", "k1"])),
        "claim key 'k1' is not the current lease",
    );
    assert_eq!(
        before,
        p.db_dump(None),
        "a refused stale write changed the store"
    );

    // Lease 2 expires and the same agent takes the todo over from itself: lease 3.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let c3 = p.json(&args("claim", &["--idempotency-key", "k3"]));
    assert_eq!(c3["claim"]["fence"], 3);
    refused(
        p.run(&args("complete", &["--fence", "2", "--evidence", "late"])),
        "stale fence 2",
    );
    refused(
        p.run(&args(
            "complete",
            &["--claim-key", "k2", "--evidence", "late"],
        )),
        "claim key 'k2' is not the current lease",
    );
    let todo = p.json(&["todo", "show", "--goal-id", &g, "--todo-id", &t]);
    assert_eq!(todo["todo"]["status"], "claimed");
    assert_eq!(todo["evidence"].as_array().unwrap().len(), 0);

    // The current proof works.
    p.json(&args("complete", &["--fence", "3", "--evidence", "done"]));
}

/// Processes that write the same run's report at once (each command that records a run, and
/// every `refresh-state` that re-creates missing reports) render the same bytes: the report
/// already in place is their success, not a conflict that stops the re-creation of the rest.
#[test]
fn processes_writing_the_same_run_reports_at_once_all_succeed() {
    let p = Project::new();
    let g = p.goal("reports");
    for i in 0..20 {
        p.ok(&[
            "refresh-state",
            "--goal-id",
            &g,
            "--summary",
            &format!("run {i}"),
        ]);
    }
    let runs = p.state().join("goals").join(&g).join("runs");
    let reports = || -> Vec<(std::path::PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(&runs)
            .unwrap()
            .flat_map(|month| std::fs::read_dir(month.unwrap().path()).unwrap())
            .map(|f| f.unwrap().path())
            .filter(|f| !f.file_name().unwrap().to_string_lossy().starts_with('.'))
            .map(|f| (f.clone(), std::fs::read(&f).unwrap()))
            .collect();
        files.sort();
        files
    };
    let written = reports();
    assert_eq!(written.len(), 40, "{written:?}");
    for round in 0..5 {
        // What a writer killed right after its commit leaves: the run, without its report.
        for (path, _) in &written {
            std::fs::remove_file(path).unwrap();
        }
        let barrier = Arc::new(Barrier::new(4));
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let mut cmd = if i % 2 == 0 {
                    p.command(&["refresh-state"])
                } else {
                    p.command(&["refresh-state", "--goal-id", &g])
                };
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    to_run(cmd.output().expect("spawn"))
                })
            })
            .collect();
        for h in handles {
            let r = h.join().unwrap();
            assert_eq!(r.code, 0, "round {round}: {r:?}");
            assert!(!r.stderr.contains("warning"), "round {round}: {r:?}");
        }
        // Each `--goal-id` refresh recorded a run of its own; the others' reports are back.
        let now = reports();
        for report in &written {
            assert!(
                now.contains(report),
                "round {round}: {} missing or changed",
                report.0.display()
            );
        }
    }
}
