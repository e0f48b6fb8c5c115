//! A project that ran for months against a fresh one, in the same run: whether the cost of the
//! hot path stays flat in history.
//!
//! The long project holds `HISTORY` settled turns, each with what a real turn leaves behind (its
//! completed todo with one evidence item, its run, its spend, its journal row and its op-log rows,
//! copied from a turn run for real on a template project), one a minute, so the quota window
//! (30 days) holds about 43,000 of the spends. Both projects then have the same open work
//! (`TICK_TODOS` for the tick, `TURN_TODOS` for the turns) and the same quota policy. Each round
//! runs, on both projects in alternating order, each command as a fresh `loopx` process: one
//! `turn run` (the turn bench's `/bin/echo` host), the tick's five commands, `status`,
//! `quota should-run` and `history --limit 20`, timing it from spawn to exit and reading its peak
//! memory (max RSS, from `wait4`). It prints each median, the long/fresh ratio, the worst peak
//! memory and its ratio, and asserts that every timed command succeeded and did its work.
//!
//! Then, in separate rounds (so the probe does not slow the timed ones), writer contention: a
//! thread of this process takes SQLite's write lock on the project over and over, spinning on a
//! busy lock, while one command runs; the longest wait is the longest time that command held the
//! write lock (its longest transaction), the sum of the waits the total. Beside them, the physical
//! floors of the same run: a process spawn and an fsync.
//!
//! Run with `cargo bench --bench long_project` (release build; about two minutes, most of it the
//! seeding). `LOOPX_BENCH_DIR` picks the disk the projects live on.

mod support;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use loopx::Kernel;
use loopx::kernel::Actor;
use loopx::kernel::goal::NewGoal;
use loopx::kernel::quota::PolicyPatch;
use loopx::model::{
    Evidence, JournalStatus, LedgerEntry, LedgerKind, Priority, Run, Todo, TodoStatus,
};
use loopx::paths::ProjectPaths;
use loopx::runtime::{TurnRequest, TurnResultKind, run_turn};
use support::{LOOPX, fsync_samples, median, open_todo, spawn_samples};

/// Settled turns in the long project; `LOOPX_BENCH_HISTORY` sets another number for a quick try.
const HISTORY: usize = 100_000;
const ROUNDS: usize = 11;
/// Rounds with the write-lock probe, after the timed ones.
const LOCK_ROUNDS: usize = 4;
const TICK_TODOS: usize = ROUNDS + LOCK_ROUNDS;
const TURN_TODOS: usize = 1_000;
const WINDOW_HOURS: f64 = 720.0;
const HOST_RESULT: &str = r#"{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"bench","evidence":[{"text":"bench evidence"}]}"#;

/// One finished child process: wall time from spawn to exit, peak resident memory, its output.
struct Finished {
    took: Duration,
    max_rss_kib: i64,
    stdout: String,
}

/// Runs `loopx args` in `dir` to completion, reaping it with `wait4` for its own `rusage`, and
/// asserts it succeeded. Output goes to files so the child never blocks on a full pipe.
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also returns its rusage"
)]
fn run(dir: &Path, args: &[&str]) -> Finished {
    let out_path = dir.join(".bench-stdout");
    let err_path = dir.join(".bench-stderr");
    let mut cmd = Command::new(LOOPX);
    cmd.args(args)
        .current_dir(dir)
        .env_remove("LD_LIBRARY_PATH")
        .stdin(Stdio::null())
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(&err_path).unwrap());
    let start = Instant::now();
    let child = cmd.spawn().unwrap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it for the child reaped.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child by pid with valid out-pointers.
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    let took = start.elapsed();
    assert_eq!(pid, child.id() as libc::pid_t, "wait4 reaped the child");
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "loopx {args:?} failed in {}: {}{}",
        dir.display(),
        stdout,
        std::fs::read_to_string(&err_path).unwrap()
    );
    Finished {
        took,
        max_rss_kib: usage.ru_maxrss,
        stdout,
    }
}

/// A project with goal `bench` under a 30-day window with room for every spend, the tick's todos
/// `t1`.. (P4, claimed by id) and the turns' todos `w1`.. (P1, picked as the next ready work).
fn project(dir: &Path) -> Kernel {
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
    k.set_quota(
        &Actor::Operator,
        "bench",
        PolicyPatch {
            window_hours: Some(WINDOW_HOURS),
            allowed_slots: Some(1_000_000),
            ..PolicyPatch::default()
        },
    )
    .unwrap();
    let now = loopx::clock::now_ms();
    k.write(|tx| {
        for i in 1..=TICK_TODOS {
            tx.insert_todo(&open_todo(
                format!("t{i}"),
                "bench todo".into(),
                Priority::P4,
                now,
            ))?;
        }
        for i in 1..=TURN_TODOS {
            tx.insert_todo(&open_todo(
                format!("w{i}"),
                "bench todo".into(),
                Priority::P1,
                now,
            ))?;
        }
        Ok(())
    })
    .unwrap();
    k
}

fn turn_request(agent: &str) -> TurnRequest {
    let mut req = TurnRequest::new(
        "bench",
        agent,
        vec!["/bin/echo".to_string(), HOST_RESULT.to_string()],
    );
    req.trust_host_completion = true;
    req.timeout_seconds = 30;
    req
}

/// Adds `HISTORY` settled turns to the project in `dir`, each a copy of what one real turn left
/// in `template` (its todo, evidence, run, spend, journal row and op-log rows) with its own ids,
/// dated one a minute up to now; each todo depends on the one before it.
fn add_history(k: &mut Kernel, template: &mut Kernel, history: usize) {
    let o = run_turn(template, &turn_request("hist-0")).unwrap();
    assert_eq!(o.kind, Some(TurnResultKind::ValidatedCompletion), "{o:?}");
    let key = o.turn_key.clone().unwrap();
    let (turn, todo, evidence, runs, ledger, ops) = template
        .read(|tx| {
            let turn = tx.turn(&key)?.expect("the template turn");
            let todo_id = turn.todo_id.clone().expect("the template turn's todo");
            let todo = tx.todo("bench", &todo_id)?.expect("the template todo");
            Ok((
                turn,
                todo,
                tx.evidence_for("bench", &todo_id)?,
                tx.runs("bench", 10, None)?,
                tx.recent_ledger("bench", 10)?,
                tx.ops(Some("bench"), 100)?,
            ))
        })
        .unwrap();
    assert_eq!(todo.status, TodoStatus::Completed);
    // Only the rows the turn wrote (set_quota and goal creation came before it).
    let ops: Vec<_> = ops
        .into_iter()
        .filter(|op| op.created_at >= turn.created_at)
        .collect();
    let now = loopx::clock::now_ms();
    // In batches, so the WAL is checkpointed as it goes instead of holding the whole history.
    for batch in (0..history).collect::<Vec<_>>().chunks(5_000) {
        k.write(|tx| {
            for &i in batch {
                let at = now - ((history - i) as i64) * 60_000;
                let agent = format!("hist-{}", i % 4);
                let todo_id = format!("h{i}");
                let run_id = format!("00H{i:023}");
                tx.insert_todo(&Todo {
                    id: todo_id.clone(),
                    created_at: at,
                    updated_at: at,
                    claim: None,
                    // A chain, so the history holds as many dependency rows as todos.
                    depends_on: i
                        .checked_sub(1)
                        .map(|p| format!("h{p}"))
                        .into_iter()
                        .collect(),
                    ..todo.clone()
                })?;
                for e in &evidence {
                    tx.insert_evidence(&Evidence {
                        todo_id: todo_id.clone(),
                        run_id: Some(run_id.clone()),
                        created_at: at,
                        ..e.clone()
                    })?;
                }
                for r in &runs {
                    tx.insert_run(&Run {
                        id: run_id.clone(),
                        agent_id: Some(agent.clone()),
                        todo_id: Some(todo_id.clone()),
                        created_at: at,
                        ..r.clone()
                    })?;
                }
                for l in &ledger {
                    tx.insert_ledger(&LedgerEntry {
                        effect_id: format!("run:{run_id}"),
                        agent_id: Some(agent.clone()),
                        run_id: Some(run_id.clone()),
                        kind: LedgerKind::Spend,
                        created_at: at,
                        ..l.clone()
                    })?;
                }
                tx.upsert_turn(&loopx::model::TurnRecord {
                    turn_key: format!("turn-hist-{i}"),
                    agent_id: agent.clone(),
                    todo_id: Some(todo_id.clone()),
                    status: JournalStatus::Committed,
                    created_at: at,
                    updated_at: at,
                    ..turn.clone()
                })?;
                for (j, op) in ops.iter().enumerate() {
                    let mut op = op.clone();
                    op.id = format!("00H{i:020}{j:03}");
                    op.created_at = at;
                    tx.append_op(&op)?;
                }
            }
            Ok(())
        })
        .unwrap();
    }
    // Where the last of these spends left the window's count.
    k.write(|tx| {
        let since = now - (WINDOW_HOURS * 3_600_000.0) as i64;
        for a in 0..4 {
            tx.move_quota_window("bench", Some(&format!("hist-{a}")), since)?;
        }
        Ok(())
    })
    .unwrap();
}

/// The commands measured, in the order each round runs them on a project.
const NAMES: [&str; 9] = [
    "turn run",
    "quota should-run",
    "todo claim",
    "todo complete",
    "refresh-state",
    "quota spend-slot",
    "status",
    "quota should-run (operator)",
    "history --limit 20",
];

/// The argv of command `i` of [`NAMES`] in round `r`: a turn, the tick's five commands
/// ([`support::tick_argv`]), then three reads.
fn argv(i: usize, r: usize) -> Vec<String> {
    let g = ["--goal-id", "bench"];
    let v: Vec<&str> = match i {
        0 => [
            &["--format", "json", "turn", "run"][..],
            &g,
            &[
                "--agent-id",
                "turn-agent",
                "--trust-host-completion",
                "--timeout-seconds",
                "30",
                "--",
                "/bin/echo",
                HOST_RESULT,
            ],
        ]
        .concat(),
        1..=5 => return support::tick_argv(r)[i - 1].clone(),
        6 => vec!["status"],
        7 => [&["quota", "should-run"][..], &g].concat(),
        _ => [&["history"][..], &g, &["--limit", "20"]].concat(),
    };
    v.into_iter().map(str::to_owned).collect()
}

/// What a command's output must show for its timing to count.
fn check(i: usize, out: &Finished) {
    if i == 0 {
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            v["turn"]["kind"], "validated_completion",
            "the timed turn did not complete its todo: {v}"
        );
    }
}

/// Per project: every command's samples.
#[derive(Default)]
struct Samples {
    took: [Vec<Duration>; NAMES.len()],
    rss: [Vec<i64>; NAMES.len()],
}

/// Takes the write lock over and over from a connection of its own until stopped, spinning while
/// the lock is busy, and returns the longest wait and the sum of all waits: how long, and how
/// long at most at a time, other processes held the lock meanwhile.
fn lock_probe(db: std::path::PathBuf, stop: Arc<AtomicBool>) -> (Duration, Duration) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.busy_handler(Some(|_| {
        std::thread::yield_now();
        true
    }))
    .unwrap();
    let (mut longest, mut total) = (Duration::ZERO, Duration::ZERO);
    while !stop.load(Ordering::Relaxed) {
        let s = Instant::now();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let waited = s.elapsed();
        conn.execute_batch("COMMIT").unwrap();
        longest = longest.max(waited);
        total += waited;
        std::thread::sleep(Duration::from_micros(50));
    }
    (longest, total)
}

/// A project directory, removed at the end unless kept.
enum Dir {
    Temp(tempfile::TempDir),
    Kept(std::path::PathBuf),
}

impl Dir {
    fn path(&self) -> &Path {
        match self {
            Dir::Temp(d) => d.path(),
            Dir::Kept(p) => p,
        }
    }
}

/// The WAL file's length and the bytes of it in use: the frames from the start that carry the
/// salt of its header (SQLite's WAL format). A WAL started over in place keeps its old frames
/// behind the new ones, under the old salt, until they are overwritten.
fn wal_bytes(path: &Path) -> (u64, u64) {
    let Ok(bytes) = std::fs::read(path) else {
        return (0, 0);
    };
    if bytes.len() < 32 {
        return (bytes.len() as u64, 0);
    }
    let page = u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let salt = &bytes[16..24];
    let frame = 24 + page;
    let live = bytes[32..]
        .chunks(frame)
        .take_while(|f| f.len() == frame && &f[8..16] == salt)
        .count();
    (bytes.len() as u64, (32 + live * frame) as u64)
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// Set in the child process that seeds the projects (see `main`).
const SEED_ENV: &str = "LOOPX_BENCH_LONG_PROJECT_SEEDER";

/// The seeding child: `<fresh> <long> <template> <history>`.
fn seed_projects(args: &[String]) {
    let [fresh, long, template, history] = args else {
        panic!("seeder arguments: {args:?}");
    };
    drop(project(Path::new(fresh)));
    let mut k = project(Path::new(long));
    let mut t = project(Path::new(template));
    add_history(&mut k, &mut t, history.parse().unwrap());
}

fn main() {
    if std::env::var_os(SEED_ENV).is_some() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        seed_projects(&args[args.len() - 4..]);
        return;
    }
    let base = std::env::var_os("LOOPX_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let fresh = tempfile::tempdir_in(&base).unwrap();
    let long = tempfile::tempdir_in(&base).unwrap();
    let template = tempfile::tempdir_in(&base).unwrap();
    // `LOOPX_BENCH_KEEP` keeps both projects for a look afterwards.
    let (fresh, long) = if std::env::var_os("LOOPX_BENCH_KEEP").is_some() {
        let kept = (fresh.keep(), long.keep());
        eprintln!("keeping {} and {}", kept.0.display(), kept.1.display());
        (Dir::Kept(kept.0), Dir::Kept(kept.1))
    } else {
        (Dir::Temp(fresh), Dir::Temp(long))
    };
    let seeding = Instant::now();
    let history = std::env::var("LOOPX_BENCH_HISTORY")
        .ok()
        .map(|v| v.parse().expect("LOOPX_BENCH_HISTORY is a number"))
        .unwrap_or(HISTORY);
    // Seeded by a child process of this binary: a child's peak RSS as `wait4` reports it starts
    // at its parent's high-water mark (the child shares the parent's memory until it execs), so
    // the process that spawns the measured commands must never have grown.
    let seeder = Command::new(std::env::current_exe().unwrap())
        .env(SEED_ENV, "1")
        .args([fresh.path(), long.path(), template.path()])
        .arg(history.to_string())
        .status()
        .unwrap();
    assert!(seeder.success(), "seeding failed");
    let db_bytes = std::fs::metadata(long.path().join(".loopx/loopx.db"))
        .map(|m| m.len())
        .unwrap_or(0);
    eprintln!(
        "seeded {history} settled turns ({:.0} MB of database) in {:.1}s",
        db_bytes as f64 / 1e6,
        seeding.elapsed().as_secs_f64()
    );
    let projects = [fresh.path(), long.path()];
    let mut samples = [Samples::default(), Samples::default()];
    let (mut spawn, mut fsync) = (Vec::new(), Vec::new());
    // The largest `-wal` file, and the most bytes of it in use, seen after any timed command.
    let mut wal_max = [(0u64, 0u64); 2];
    for r in 0..ROUNDS {
        for p in [r % 2, 1 - r % 2] {
            for i in 0..NAMES.len() {
                let args = argv(i, r);
                let out = run(
                    projects[p],
                    &args.iter().map(String::as_str).collect::<Vec<_>>(),
                );
                check(i, &out);
                let (file, live) = wal_bytes(&projects[p].join(".loopx/loopx.db-wal"));
                wal_max[p] = (wal_max[p].0.max(file), wal_max[p].1.max(live));
                samples[p].took[i].push(out.took);
                samples[p].rss[i].push(out.max_rss_kib);
            }
        }
        spawn.extend(spawn_samples(3));
        fsync.extend(fsync_samples(long.path(), 3, Duration::ZERO));
    }
    // Writer contention, in rounds of their own: the probe spins on one core.
    let writers = [0usize, 2, 3, 4, 5];
    let mut held: [[Vec<(Duration, Duration)>; 5]; 2] = Default::default();
    for r in ROUNDS..ROUNDS + LOCK_ROUNDS {
        for p in [r % 2, 1 - r % 2] {
            for (w, &i) in writers.iter().enumerate() {
                let stop = Arc::new(AtomicBool::new(false));
                let db = projects[p].join(".loopx/loopx.db");
                let probe = {
                    let stop = stop.clone();
                    std::thread::spawn(move || lock_probe(db, stop))
                };
                let args = argv(i, r);
                let out = run(
                    projects[p],
                    &args.iter().map(String::as_str).collect::<Vec<_>>(),
                );
                stop.store(true, Ordering::Relaxed);
                check(i, &out);
                held[p][w].push(probe.join().unwrap());
            }
        }
    }
    let (spawn, fsync) = (median(spawn), median(fsync));
    println!(
        "long project: {history} settled turns, completed todos, runs and spends (one a minute; \
         {WINDOW_HOURS} h quota window), against a fresh project; medians of {ROUNDS} rounds"
    );
    println!();
    println!(
        "| command | fresh (ms) | long (ms) | long/fresh | peak RSS fresh (MiB) | peak RSS long (MiB) | long/fresh |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let mut worst = (0.0f64, 0.0f64);
    for (i, name) in NAMES.iter().enumerate() {
        let a = median(samples[0].took[i].clone());
        let b = median(samples[1].took[i].clone());
        let ra = *samples[0].rss[i].iter().max().unwrap() as f64 / 1024.0;
        let rb = *samples[1].rss[i].iter().max().unwrap() as f64 / 1024.0;
        let (rt, rm) = (b.as_secs_f64() / a.as_secs_f64(), rb / ra);
        worst = (worst.0.max(rt), worst.1.max(rm));
        println!(
            "| `{name}` | {} | {} | {rt:.2}x | {ra:.1} | {rb:.1} | {rm:.2}x |",
            ms(a),
            ms(b)
        );
    }
    println!();
    println!(
        "worst ratio: time {:.2}x (target 1.2x), peak memory {:.2}x (target 2x)",
        worst.0, worst.1
    );
    println!();
    println!(
        "| write lock held (median of {LOCK_ROUNDS}) | fresh: longest / total (ms) | long: longest / total (ms) |"
    );
    println!("|---|---:|---:|");
    for (w, &i) in writers.iter().enumerate() {
        let cell = |p: usize| {
            let longest = median(held[p][w].iter().map(|h| h.0).collect());
            let total = median(held[p][w].iter().map(|h| h.1).collect());
            format!("{} / {}", ms(longest), ms(total))
        };
        println!("| `{}` | {} | {} |", NAMES[i], cell(0), cell(1));
    }
    println!();
    println!(
        "floors, same run: process spawn {} ms, fsync of 4 KiB {} ms",
        ms(spawn),
        ms(fsync)
    );
    for (p, name) in ["fresh", "long"].iter().enumerate() {
        println!(
            "WAL after a command ({name}): file at most {} KiB, of which in use at most {} KiB",
            wal_max[p].0 / 1024,
            wal_max[p].1 / 1024
        );
    }
    // Every timed command did its work: each round's tick completed its todo, and each turn
    // one of the turns' todos.
    let rounds = ROUNDS + LOCK_ROUNDS;
    for dir in projects {
        for r in 0..rounds {
            let todo = format!("t{}", r + 1);
            let out = run(
                dir,
                &[
                    "--format",
                    "json",
                    "todo",
                    "show",
                    "--goal-id",
                    "bench",
                    "--todo-id",
                    &todo,
                ],
            );
            let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
            assert_eq!(v["todo"]["status"], "completed", "round {r}'s tick: {v}");
        }
        let out = run(
            dir,
            &[
                "--format",
                "json",
                "turn",
                "list",
                "--goal-id",
                "bench",
                "--limit",
                "100",
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let worked = v["turns"]
            .as_array()
            .expect("a turn list")
            .iter()
            .filter(|t| t["agent_id"] == "turn-agent" && t["status"] == "committed")
            .count();
        assert_eq!(worked, rounds, "one committed turn per round");
    }
}
