//! The core tick as whole processes: `quota should-run`, `todo claim`, `todo complete`,
//! `refresh-state`, `quota spend-slot`, each a fresh `loopx` process, on a goal with 1,000 todos and
//! either 0 or 100,000 history rows. Beside it, in the same run, the physical floor: a process
//! spawn and an fsync on the same disk. Run with `cargo bench --bench tick`.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use loopx::Kernel;
use loopx::kernel::Actor;
use loopx::kernel::goal::NewGoal;
use loopx::kernel::model::{Priority, Role, Run, Todo, TodoKind, TodoStatus};
use loopx::paths::ProjectPaths;

const TODOS: usize = 1_000;
const HISTORY: usize = 100_000;
const ROUNDS: usize = 40;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Seeds a project through the library: one goal, `TODOS` todos, `runs` history rows.
fn seed(dir: &Path, runs: usize) {
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
        for i in 0..TODOS {
            tx.insert_todo(&Todo {
                id: format!("t{}", i + 1),
                goal_id: "bench".into(),
                role: Role::Agent,
                kind: TodoKind::Task,
                title: format!("bench todo {i}"),
                detail: String::new(),
                priority: Priority::from_rank((i % 5) as i64),
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
            })?;
        }
        for i in 0..runs {
            tx.insert_run(&Run {
                id: format!("00H{:023}", i),
                goal_id: "bench".into(),
                agent_id: Some(format!("hist-{}", i % 7)),
                todo_id: None,
                classification: "state_refresh".into(),
                outcome: None,
                summary: format!("historic run {i}"),
                payload: serde_json::json!({"i": i}),
                created_at: now - 1_000,
            })?;
        }
        Ok(())
    })
    .unwrap();
}

fn loopx(dir: &Path, args: &[&str]) -> Duration {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_loopx"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

struct Tick {
    steps: [Vec<Duration>; 5],
    total: Vec<Duration>,
}

fn tick_rounds(dir: &Path) -> Tick {
    let mut t = Tick {
        steps: Default::default(),
        total: Vec::new(),
    };
    for r in 0..ROUNDS {
        let agent = format!("bench-{r}");
        let key = format!("k{r}");
        let todo = format!("t{}", r + 1);
        let start = Instant::now();
        let d = [
            loopx(
                dir,
                &[
                    "quota",
                    "should-run",
                    "--goal-id",
                    "bench",
                    "--agent-id",
                    &agent,
                ],
            ),
            loopx(
                dir,
                &[
                    "todo",
                    "claim",
                    "--goal-id",
                    "bench",
                    "--todo-id",
                    &todo,
                    "--agent-id",
                    &agent,
                    "--idempotency-key",
                    &key,
                ],
            ),
            loopx(
                dir,
                &[
                    "todo",
                    "complete",
                    "--goal-id",
                    "bench",
                    "--todo-id",
                    &todo,
                    "--agent-id",
                    &agent,
                    "--claim-key",
                    &key,
                    "--evidence",
                    "bench",
                ],
            ),
            loopx(
                dir,
                &[
                    "refresh-state",
                    "--goal-id",
                    "bench",
                    "--agent-id",
                    &agent,
                    "--todo-id",
                    &todo,
                ],
            ),
            loopx(
                dir,
                &[
                    "quota",
                    "spend-slot",
                    "--goal-id",
                    "bench",
                    "--agent-id",
                    &agent,
                ],
            ),
        ];
        t.total.push(start.elapsed());
        for (i, x) in d.into_iter().enumerate() {
            t.steps[i].push(x);
        }
    }
    t
}

fn spawn_floor() -> Duration {
    median(
        (0..ROUNDS * 2)
            .map(|_| {
                let s = Instant::now();
                Command::new("true").status().unwrap();
                s.elapsed()
            })
            .collect(),
    )
}

fn fsync_floor(dir: &Path) -> Duration {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = vec![7u8; 4096];
    let d = median(
        (0..ROUNDS * 2)
            .map(|_| {
                let s = Instant::now();
                f.write_all(&block).unwrap();
                f.sync_all().unwrap();
                s.elapsed()
            })
            .collect(),
    );
    std::fs::remove_file(path).unwrap();
    d
}

fn main() {
    let base = std::env::var_os("LOOPX_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let empty = tempfile::tempdir_in(&base).unwrap();
    let full = tempfile::tempdir_in(&base).unwrap();
    let seed_start = Instant::now();
    seed(empty.path(), 0);
    seed(full.path(), HISTORY);
    eprintln!(
        "seeded 2 x {TODOS} todos and {HISTORY} history rows in {:.1}s",
        seed_start.elapsed().as_secs_f64()
    );

    let spawn = spawn_floor();
    let fsync = fsync_floor(full.path());
    let a = tick_rounds(empty.path());
    let b = tick_rounds(full.path());
    let floor = spawn * 5 + fsync * 4;

    let names = [
        "quota should-run",
        "todo claim",
        "todo complete",
        "refresh-state",
        "quota spend-slot",
    ];
    println!(
        "| step ({TODOS} todos, median of {ROUNDS}) | 0 history rows (ms) | {HISTORY} history rows (ms) |"
    );
    println!("|---|---:|---:|");
    for (i, name) in names.iter().enumerate() {
        println!(
            "| {name} | {} | {} |",
            ms(median(a.steps[i].clone())),
            ms(median(b.steps[i].clone()))
        );
    }
    let ta = median(a.total);
    let tb = median(b.total);
    println!(
        "| **whole tick (5 processes)** | **{}** | **{}** |",
        ms(ta),
        ms(tb)
    );
    println!();
    println!("| physical floor, same run | ms |");
    println!("|---|---:|");
    println!("| process spawn (`true`) | {} |", ms(spawn));
    println!("| fsync of 4 KiB | {} |", ms(fsync));
    println!("| 5 spawns + 4 fsyncs | {} |", ms(floor));
    println!();
    println!(
        "tick / floor: {:.2}x at 0 rows, {:.2}x at {HISTORY} rows (target: within 3x)",
        ta.as_secs_f64() / floor.as_secs_f64(),
        tb.as_secs_f64() / floor.as_secs_f64()
    );
}
