//! What the benchmarks share: a seeded project, whole-process timing of `loopx`, the manual
//! five-command tick, and the physical floors (spawn, fsync) measured in the same run.
#![allow(dead_code)] // each bench binary uses its own subset

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use loopx::Kernel;
use loopx::kernel::Actor;
use loopx::kernel::goal::NewGoal;
use loopx::model::{Priority, Role, Run, Todo, TodoKind, TodoStatus};
use loopx::paths::ProjectPaths;

pub fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

/// A project with goal `bench`, `todos` open todos (`t1`..) and `history` run rows, seeded through
/// the library in one transaction.
pub fn seed(dir: &Path, todos: usize, history: usize) -> Kernel {
    Kernel::init(dir).unwrap().expect("fresh project");
    let mut k = Kernel::open(ProjectPaths::at(dir)).unwrap();
    k.create_goal(
        &Actor::Operator,
        NewGoal {
            id: Some("bench".into()),
            title: "Bench goal".into(),
            ..Default::default()
        },
    )
    .unwrap();
    let now = loopx::clock::now_ms();
    k.write(|tx| {
        for i in 0..todos {
            tx.insert_todo(&open_todo(
                format!("t{}", i + 1),
                format!("bench todo {i}"),
                Priority::from_rank((i % 5) as i64).expect("0 to 4 are ranks"),
                now,
            ))?;
        }
        for i in 0..history {
            tx.insert_run(&Run {
                id: format!("00H{i:023}"),
                goal_id: "bench".into(),
                agent_id: Some(format!("hist-{}", i % 7)),
                todo_id: None,
                classification: "state_refresh".into(),
                outcome: None,
                summary: format!("historic run {i}"),
                payload: serde_json::json!({ "i": i }),
                created_at: now - 1_000,
            })?;
        }
        Ok(())
    })
    .unwrap();
    k
}

/// An open agent task of goal `bench`, as every bench seeds them.
pub fn open_todo(id: String, title: String, priority: Priority, now: i64) -> Todo {
    Todo {
        id,
        goal_id: "bench".into(),
        role: Role::Agent,
        kind: TodoKind::Task,
        title,
        detail: String::new(),
        priority,
        status: TodoStatus::Open,
        depends_on: Vec::new(),
        capability: None,
        lane: None,
        gate_scope: None,
        claim: None,
        last_fence: 0,
        status_reason: None,
        created_at: now,
        updated_at: now,
    }
}

/// Runs `cmd` to completion, capturing its output, and returns the time from spawn to exit. Every
/// process a benchmark times, the floors included, goes through here, so all pay the same spawn.
///
/// Without Cargo's `LD_LIBRARY_PATH`: `cargo bench` points it at the toolchain's and the target
/// directory's libraries, so the dynamic loader of a dynamically linked floor process (`true`)
/// searched four directories for libc before its own, while the static `loopx` never looks. The
/// floor then came out higher under `cargo bench` than with the bench binary run directly, and
/// the tick's ratio to it lower (docs/benchmarks.md).
fn timed(cmd: &mut Command) -> Duration {
    cmd.env_remove("LD_LIBRARY_PATH");
    let start = Instant::now();
    let out = cmd.output().unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// The `loopx` binary of this build.
pub const LOOPX: &str = env!("CARGO_BIN_EXE_loopx");

/// One `loopx` process, timed from spawn to exit.
pub fn loopx(dir: &Path, args: &[&str]) -> Duration {
    loopx_at(Path::new(LOOPX), dir, args)
}

/// One process of the `loopx` binary at `bin`, timed from spawn to exit.
pub fn loopx_at(bin: &Path, dir: &Path, args: &[&str]) -> Duration {
    timed(Command::new(bin).args(args).current_dir(dir))
}

/// The seeds' tick as five processes of this build's `loopx`, round `r` working todo `t{r+1}` as
/// agent `bench-{r}`: should-run, claim, complete, refresh-state, spend-slot.
pub fn manual_tick(dir: &Path, r: usize) -> [Duration; 5] {
    manual_tick_at(Path::new(LOOPX), dir, r)
}

/// [`manual_tick`] with the `loopx` binary at `bin`.
pub fn manual_tick_at(bin: &Path, dir: &Path, r: usize) -> [Duration; 5] {
    tick_argv(r).map(|args| {
        loopx_at(
            bin,
            dir,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        )
    })
}

/// The argv of the five tick commands of round `r` on goal `bench`: `should-run`, then claim,
/// complete, refresh-state and spend-slot on todo `t{r+1}` as agent `bench-{r}`.
pub fn tick_argv(r: usize) -> [Vec<String>; 5] {
    let agent = format!("bench-{r}");
    let key = format!("k{r}");
    let todo = format!("t{}", r + 1);
    let g = ["--goal-id", "bench"];
    let owned = |words: Vec<&str>| words.into_iter().map(str::to_owned).collect::<Vec<_>>();
    [
        owned([&["quota", "should-run"][..], &g, &["--agent-id", &agent]].concat()),
        owned(
            [
                &["todo", "claim"][..],
                &g,
                &[
                    "--todo-id",
                    &todo,
                    "--agent-id",
                    &agent,
                    "--idempotency-key",
                    &key,
                ],
            ]
            .concat(),
        ),
        owned(
            [
                &["todo", "complete"][..],
                &g,
                &[
                    "--todo-id",
                    &todo,
                    "--agent-id",
                    &agent,
                    "--claim-key",
                    &key,
                    "--evidence",
                    "bench evidence",
                ],
            ]
            .concat(),
        ),
        owned(
            [
                &["refresh-state"][..],
                &g,
                &["--agent-id", &agent, "--todo-id", &todo],
            ]
            .concat(),
        ),
        owned([&["quota", "spend-slot"][..], &g, &["--agent-id", &agent]].concat()),
    ]
}

/// What `rounds` ticks of [`manual_tick_at`] must have done to the project in `dir`, read through
/// `bin` after the timing is over: todos `t1`..`t{rounds}` completed with the tick's evidence, every
/// other todo still open, and one slot spent per tick. A tick whose commands exit 0 without doing
/// their work would otherwise be timed as a fast tick.
pub fn assert_ticks_done(bin: &Path, dir: &Path, rounds: usize) {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(bin)
            .args(["--format", "json"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let todos = json(&["todo", "list", "--goal-id", "bench"]);
    let todos = todos["todos"].as_array().expect("a todo list");
    let completed: Vec<&str> = todos
        .iter()
        .filter(|t| t["status"] == "completed")
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = (1..=rounds).map(|i| format!("t{i}")).collect();
    let mut sorted = completed.clone();
    sorted.sort_by_key(|id| id[1..].parse::<usize>().unwrap_or(usize::MAX));
    assert_eq!(
        sorted, expected,
        "the ticks completed other todos than theirs"
    );
    assert!(
        todos
            .iter()
            .filter(|t| t["status"] != "completed")
            .all(|t| t["status"] == "open"),
        "a tick left a todo claimed or blocked"
    );
    let last = json(&[
        "todo",
        "show",
        "--goal-id",
        "bench",
        "--todo-id",
        &expected[rounds - 1],
    ]);
    assert!(
        last["evidence"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["text"] == "bench evidence"),
        "the last tick's evidence is missing: {last}"
    );
    let quota = json(&["quota", "show", "--goal-id", "bench"]);
    assert_eq!(
        quota["quota"]["spent_slots"].as_u64(),
        Some(rounds as u64),
        "one slot spent per tick: {}",
        quota["quota"]
    );
}

/// What the timed `loopx turn run` processes in `dir` must have done, read after the timing is
/// over: at least `at_least` turns, every one committed with its todo completed, and no other todo
/// touched. A turn that exits 0 having failed (a host failure is a settled turn, not an error)
/// would otherwise be timed as a fast turn.
pub fn assert_turns_completed(dir: &Path, at_least: usize) {
    let json = |args: &[&str]| -> serde_json::Value {
        let out = Command::new(LOOPX)
            .args(["--format", "json"])
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let turns = json(&["turn", "list", "--goal-id", "bench", "--limit", "1000"]);
    let turns = turns["turns"].as_array().expect("a turn list");
    assert!(
        turns.len() >= at_least,
        "{} turns, expected {at_least}",
        turns.len()
    );
    let mut worked: Vec<&str> = Vec::new();
    for t in turns {
        assert_eq!(t["status"], "committed", "a timed turn did not commit: {t}");
        worked.push(t["todo_id"].as_str().expect("the turn's todo"));
    }
    let todos = json(&["todo", "list", "--goal-id", "bench"]);
    let mut completed: Vec<&str> = todos["todos"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["status"] == "completed")
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    worked.sort_unstable();
    completed.sort_unstable();
    assert_eq!(
        worked, completed,
        "the turns' todos and the completed todos differ"
    );
}

/// The floor process: `true`, found on `PATH` once, so that no spawn pays for a `PATH` search
/// (`loopx` is spawned by its path too).
fn true_process() -> Command {
    static TRUE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let path = TRUE.get_or_init(|| {
        let path = std::env::var_os("PATH").expect("PATH is set");
        std::env::split_paths(&path)
            .map(|dir| dir.join("true"))
            .find(|candidate| candidate.is_file())
            .expect("`true` is on PATH")
    });
    Command::new(path)
}

/// `rounds` times spawning `true` and waiting for it.
pub fn spawn_samples(rounds: usize) -> Vec<Duration> {
    (0..rounds).map(|_| timed(&mut true_process())).collect()
}

/// The floor in the tick's own shape, timed as a whole: a spawn of `true` (should-run, which
/// commits nothing), then four times a spawn followed by a 4 KiB write + fsync in `dir`. Summing
/// separately measured medians leaves out what running them in this order costs on the machine
/// (on the development VM, a spawn or an fsync right after the CPU or the disk idled is slower),
/// which the tick pays too.
pub fn floor_sequence(dir: &Path) -> Duration {
    let path = dir.join("fsync-sequence-probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let start = Instant::now();
    timed(&mut true_process());
    for _ in 0..4 {
        timed(&mut true_process());
        f.write_all(&[7u8; 4096]).unwrap();
        f.sync_all().unwrap();
    }
    let took = start.elapsed();
    let _ = std::fs::remove_file(&path);
    took
}

/// `rounds` times a `loopx` process that opens the project's store, reads one row (goal `bench`,
/// through `probe show`) and exits: what every command pays before its own work, because each is
/// a new process that opens SQLite afresh (WAL index rebuilt from the WAL, schema parsed). It is
/// the product binary, linked as the tick's commands are.
pub fn store_samples(dir: &Path, rounds: usize) -> Vec<Duration> {
    (0..rounds)
        .map(|_| loopx(dir, &["probe", "show", "--goal-id", "bench"]))
        .collect()
}

/// `rounds` times a 4 KiB write + fsync on the disk holding `dir` (the cost of one durable
/// commit), each after `idle` without disk I/O. On the development VM an fsync issued after a few
/// idle milliseconds takes several times as long as one issued back to back (docs/benchmarks.md):
/// the tick's commits are each a process's work apart, so they are of the second kind.
pub fn fsync_samples(dir: &Path, rounds: usize, idle: Duration) -> Vec<Duration> {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let xs = (0..rounds)
        .map(|_| {
            std::thread::sleep(idle);
            f.write_all(&[7u8; 4096]).unwrap();
            let s = Instant::now();
            f.sync_all().unwrap();
            s.elapsed()
        })
        .collect();
    let _ = std::fs::remove_file(&path);
    xs
}
