//! SIGKILL at random points of mutating commands, at least 200 times: the database always opens,
//! passes `PRAGMA integrity_check`, and every command that reported success is visible afterwards.
//!
//! The kills land mid-work, not at process start-up: the test watches the command's open file
//! descriptors (`/proc/<pid>/fd`) until the database is open, then kills after a delay drawn from
//! the time that kind of command was measured to take from that point to its exit. A command that
//! finishes on its own must not have panicked (exit 101) or failed internally.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use crate::support::{Project, to_run};

/// Commands run to completion first, to measure each kind's work after the store is open.
const CALIBRATION: usize = 24;

/// Commands run at least this many times; more (up to `MAX_COMMANDS`) while the kills or the
/// successes fall short, since how many land depends on how busy the machine is (other tests
/// compile guest components beside this one).
const MIN_COMMANDS: usize = 200;
const MAX_COMMANDS: usize = 800;
const MIN_KILLS: usize = 40;
const MIN_KINDS_KILLED: usize = 4;
const MIN_SUCCESSES: usize = 20;

/// Whether process `pid` has the project's database open; `None` once the process is gone.
fn has_db_open(pid: u32) -> Option<bool> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(dir.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| target.ends_with(".loopx/loopx.db"))
    }))
}

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
    let mut killed_by_kind: HashMap<String, usize> = HashMap::new();
    // Open-to-exit times of the calibration runs, by kind of command.
    let mut work: HashMap<String, Vec<Duration>> = HashMap::new();
    for i in 0..MAX_COMMANDS {
        if i >= MIN_COMMANDS
            && killed >= MIN_KILLS
            && killed_by_kind.len() >= MIN_KINDS_KILLED
            && successes.len() >= MIN_SUCCESSES
        {
            break;
        }
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
        let kind = format!("{} {}", args[0], args.get(1).map_or("", |a| a.as_str()));
        let mut child = p
            .command(&refs)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Wait for the store to be open (or the process to end without opening it).
        let mut opened = None;
        while child.try_wait().unwrap().is_none() {
            match has_db_open(child.id()) {
                Some(true) => {
                    opened = Some(Instant::now());
                    break;
                }
                Some(false) => std::thread::yield_now(),
                None => break,
            }
        }
        let mut we_killed = false;
        let mut calibrating = None;
        if let Some(t_open) = opened {
            if i < CALIBRATION {
                calibrating = Some(t_open);
            } else {
                // Uniform over the longest measured open-to-exit time of this kind (or of any
                // kind, for one not measured yet): most kills land while the command works.
                let window = work
                    .get(&kind)
                    .or_else(|| work.values().max_by_key(|d| d.iter().max()))
                    .and_then(|d| d.iter().max())
                    .map_or(10_000, |d| d.as_micros() as u64)
                    .max(1);
                let until = t_open + Duration::from_micros(rng.next() % window);
                while Instant::now() < until && child.try_wait().unwrap().is_none() {
                    std::thread::yield_now();
                }
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap(); // SIGKILL
                    we_killed = true;
                }
            }
        }
        // Reads the output while waiting (a command writing more than a pipe holds would
        // otherwise never exit).
        let out = child.wait_with_output().unwrap();
        if let Some(t_open) = calibrating.filter(|_| out.status.success()) {
            work.entry(kind.clone()).or_default().push(t_open.elapsed());
        }
        if we_killed && out.status.signal() == Some(libc::SIGKILL) {
            killed += 1;
            killed_by_kind
                .entry(kind)
                .and_modify(|n| *n += 1)
                .or_insert(1);
        } else {
            // Finished on its own: never a panic, a signal of its own or an internal failure.
            assert!(
                out.status.code().is_some(),
                "{args:?} died of {:?}",
                out.status.signal()
            );
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_ne!(out.status.code(), Some(101), "{args:?} panicked: {stderr}");
            assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        }
        let run = to_run(out);
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
            // never because the store is damaged, the machine failed it, or LoopX failed itself.
            let error = &run.json()["error"];
            assert!(
                ["refused", "not_found", "conflict"].contains(&error["kind"].as_str().unwrap()),
                "{args:?} failed with {error}; stderr: {}",
                run.stderr
            );
        }
        let doctor = p.run(&["doctor"]);
        assert_eq!(
            doctor.code, 0,
            "after iteration {i} ({args:?}): {}",
            doctor.stderr
        );
    }
    eprintln!(
        "open-to-exit times measured: {work:?}; killed after the store opened: {killed_by_kind:?}"
    );
    assert!(
        killed >= MIN_KILLS,
        "the schedule must kill commands after the store is open (killed {killed}: {killed_by_kind:?})"
    );
    assert!(
        killed_by_kind.len() >= MIN_KINDS_KILLED,
        "kills must reach most kinds of command: {killed_by_kind:?}"
    );
    assert!(
        successes.len() >= MIN_SUCCESSES,
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
