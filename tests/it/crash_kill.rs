//! SIGKILL at random points of mutating commands, 200 times: the database always opens, passes
//! `PRAGMA integrity_check`, and every command that reported success is visible afterwards.

use std::time::Duration;

use crate::support::{Project, to_run};

/// A small deterministic generator so a failure reproduces with the same kill schedule.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[derive(Debug)]
enum Success {
    TodoAdded(String),
    GoalCreated(String),
    Claimed {
        todo: String,
        agent: String,
        fence: i64,
    },
    Completed {
        todo: String,
        evidence: String,
    },
    Spent(String),
    Run(String),
    Reward(String),
}

#[test]
fn sigkill_at_random_points_never_loses_a_reported_success() {
    let p = Project::new();
    let g = p.goal("crash");
    for i in 0..40 {
        p.add_todo(&g, &format!("seed {i}"), &[]);
    }
    let mut rng = Lcg(0x5eed);
    let mut successes = Vec::new();
    let mut claimed: Vec<String> = Vec::new();
    let mut runs: Vec<String> = Vec::new();
    let mut killed = 0;
    for i in 0..200 {
        let tag = format!("{i}");
        let args: Vec<String> = match rng.next() % 8 {
            0 => vec![
                "todo",
                "add",
                "--goal-id",
                &g,
                "--id",
                &format!("a{tag}"),
                "--title",
                &format!("added {tag}"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            1 => vec![
                "goal",
                "create",
                "--id",
                &format!("g{tag}"),
                "--title",
                &format!("goal {tag}"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            2 => vec![
                "todo",
                "claim",
                "--goal-id",
                &g,
                "--agent-id",
                &format!("k{tag}"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            3 if !claimed.is_empty() => {
                let t = claimed.remove(0);
                vec![
                    "todo",
                    "complete",
                    "--goal-id",
                    &g,
                    "--todo-id",
                    &t,
                    "--evidence",
                    &format!("ev{tag}"),
                ]
                .into_iter()
                .map(String::from)
                .collect()
            }
            4 => vec![
                "quota",
                "spend-slot",
                "--goal-id",
                &g,
                "--effect-id",
                &format!("e{tag}"),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            6 if !runs.is_empty() => {
                let r = runs[rng.next() as usize % runs.len()].clone();
                vec![
                    "reward",
                    "add",
                    "--goal-id",
                    &g,
                    "--run-id",
                    &r,
                    "--score",
                    "1",
                    "--comment",
                    &format!("rw{tag}"),
                ]
                .into_iter()
                .map(String::from)
                .collect()
            }
            7 => vec![
                "quota",
                "set",
                "--goal-id",
                &g,
                "--allowed-slots",
                &format!("{}", 1000 + i),
            ]
            .into_iter()
            .map(String::from)
            .collect(),
            _ => vec!["refresh-state", "--goal-id", &g]
                .into_iter()
                .map(String::from)
                .collect(),
        };
        let mut full = vec!["--format".to_string(), "json".to_string()];
        full.extend(args.iter().cloned());
        let refs: Vec<&str> = full.iter().map(String::as_str).collect();
        let mut child = p
            .command(&refs)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros(rng.next() % 40_000));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            killed += 1;
        }
        let run = to_run(child.wait_with_output().unwrap());
        if run.code == 0 {
            let v = run.json();
            let s = match args[0].as_str() {
                "todo" if args[1] == "add" => {
                    Success::TodoAdded(v["todo"]["id"].as_str().unwrap().into())
                }
                "goal" => Success::GoalCreated(v["goal"]["id"].as_str().unwrap().into()),
                "todo" if args[1] == "claim" => {
                    let todo = v["todo"]["id"].as_str().unwrap().to_string();
                    claimed.push(todo.clone());
                    Success::Claimed {
                        todo,
                        agent: v["claim"]["agent_id"].as_str().unwrap().into(),
                        fence: v["claim"]["fence"].as_i64().unwrap(),
                    }
                }
                "todo" => Success::Completed {
                    todo: args[5].clone(),
                    evidence: args[7].clone(),
                },
                "quota" if args[1] == "spend-slot" => {
                    Success::Spent(v["effect_id"].as_str().unwrap().into())
                }
                "reward" => Success::Reward(args[9].clone()),
                "refresh-state" => {
                    let id = v["run_id"].as_str().unwrap().to_string();
                    runs.push(id.clone());
                    Success::Run(id)
                }
                _ => continue,
            };
            successes.push(s);
        } else if run.code != -1 {
            // A finished command may legitimately be refused (e.g. nothing left to claim), but
            // never because the store is damaged.
            assert_ne!(
                run.code, 5,
                "{:?} reported corruption: {}",
                args, run.stderr
            );
        }
        let doctor = p.run(&["doctor"]);
        assert_eq!(
            doctor.code, 0,
            "after iteration {i} ({args:?}): {}",
            doctor.stderr
        );
    }
    assert!(
        killed >= 20,
        "the schedule must actually kill commands mid-flight (killed {killed})"
    );
    assert!(
        successes.len() >= 20,
        "and let some finish ({})",
        successes.len()
    );

    let todos = p.json(&["todo", "list", "--goal-id", &g]);
    let todo = |id: &str| {
        todos["todos"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["id"] == id)
            .cloned()
    };
    let goals = p.json(&["goal", "list"]);
    let history = p.json(&["history", "--goal-id", &g, "--limit", "1000"]);
    for s in &successes {
        match s {
            Success::TodoAdded(id) => assert!(todo(id).is_some(), "{s:?}"),
            Success::GoalCreated(id) => assert!(
                goals["goals"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x["id"] == *id),
                "{s:?}"
            ),
            Success::Claimed {
                todo: id,
                agent,
                fence,
            } => {
                let t = todo(id).expect("claimed todo exists");
                let held = t["claim"]["agent_id"] == *agent && t["claim"]["fence"] == *fence;
                assert!(held || t["status"] == "completed", "{s:?}: {t}");
            }
            Success::Completed { todo: id, evidence } => {
                let shown = p.json(&["todo", "show", "--goal-id", &g, "--todo-id", id]);
                assert_eq!(shown["todo"]["status"], "completed", "{s:?}");
                assert!(
                    shown["evidence"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|e| e["text"] == *evidence),
                    "{s:?}"
                );
            }
            Success::Spent(e) => {
                let again = p.json(&["quota", "spend-slot", "--goal-id", &g, "--effect-id", e]);
                assert_eq!(again["idempotent_replay"], true, "{s:?}");
            }
            Success::Run(id) => {
                assert!(
                    history["runs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|r| r["run_id"] == *id),
                    "{s:?}"
                );
            }
            Success::Reward(comment) => {
                let found = history["runs"].as_array().unwrap().iter().any(|r| {
                    r["rewards"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|w| w["comment"] == *comment)
                });
                assert!(found, "{s:?}");
            }
        }
    }
}
