//! Monitors at scale and the sleeping heartbeat. `cargo bench --bench monitors`.
//!
//! 1. `quota should-run` as a fresh `loopx` process on a goal with 1,000 monitors and 1,000 todos,
//!    in three shapes: tasks ready while no monitor is due (the monitors sort first in the ready
//!    queue, so the decision passes over them), only monitors with none due (`monitor_quiet`, the
//!    exact hint), and one monitor due (`monitor_due`); beside them, in the same rounds, the same
//!    goal without monitors and the physical floor (a spawn of `true`).
//! 2. A `loopx loop --watch` whose next monitor is due in an hour, left alone for a minute: its CPU
//!    time (utime + stime from /proc/<pid>/stat) over that minute.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use loopx::kernel::monitor::MonitorSpec;
use loopx::model::{Monitor, MonitorFollowUp, Priority, Todo, TodoKind};
use support::{loopx, median, open_todo, seed, spawn_samples};

const TODOS: usize = 1_000;
const MONITORS: usize = 1_000;
const ROUNDS: usize = 40;
const HOUR: i64 = 3_600_000;

/// Adds `MONITORS` monitors (`m1`..) to goal `bench`, checked once; `due` of them due now, the
/// rest spread over the next hour. With `first`, they sort before every task (P0).
fn add_monitors(dir: &Path, due: usize, first: bool) {
    let mut k = loopx::Kernel::open(loopx::paths::ProjectPaths::at(dir)).unwrap();
    let now = loopx::clock::now_ms();
    let spec = MonitorSpec::every(HOUR);
    k.write(|tx| {
        for i in 0..MONITORS {
            let id = format!("m{}", i + 1);
            tx.insert_todo(&Todo {
                kind: TodoKind::Monitor,
                ..open_todo(
                    id.clone(),
                    format!("watch metric {i}"),
                    if first { Priority::P0 } else { Priority::P3 },
                    now,
                )
            })?;
            tx.upsert_monitor(&Monitor {
                goal_id: "bench".into(),
                todo_id: id,
                every_ms: spec.every_ms,
                until_at: None,
                target: Some(format!("metric.{i}")),
                follow_up: MonitorFollowUp::OpenTodo,
                max_no_change: spec.max_no_change,
                probe: None,
                next_due_at: if i < due {
                    now - 1_000
                } else {
                    now + 60_000 + (i as i64 * HOUR / MONITORS as i64)
                },
                last_check_at: Some(now),
                last_digest: Some("0".repeat(64)),
                last_result: None,
                no_change_count: 0,
                material_change: false,
                checks: 1,
                failures: 0,
                last_failure: None,
                check_seq: 1,
                checked_fence: 0,
                created_at: now,
                updated_at: now,
            })?;
        }
        Ok(())
    })
    .unwrap();
}

fn decision(dir: &Path) -> serde_json::Value {
    let out = Command::new(support::LOOPX)
        .args([
            "--format",
            "json",
            "quota",
            "should-run",
            "--goal-id",
            "bench",
        ])
        .current_dir(dir)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn main() {
    let shapes = ["no monitors", "tasks ready", "monitor_quiet", "monitor_due"];
    let dirs: Vec<tempfile::TempDir> = shapes
        .iter()
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    seed(dirs[0].path(), TODOS, 0);
    seed(dirs[1].path(), TODOS, 0);
    add_monitors(dirs[1].path(), 0, true);
    // Only monitors: the todos are done.
    seed(dirs[2].path(), 0, 0);
    add_monitors(dirs[2].path(), 0, false);
    seed(dirs[3].path(), TODOS, 0);
    add_monitors(dirs[3].path(), 1, false);
    let expect = [
        ("ready_for_host", "run_now"),
        ("ready_for_host", "run_now"),
        ("wait", "monitor_quiet"),
        ("ready_for_host", "monitor_due"),
    ];
    for (dir, (route, action)) in dirs.iter().zip(expect) {
        let d = decision(dir.path());
        assert_eq!(d["route"], route, "{d}");
        assert_eq!(d["scheduler_hint"]["action"], action, "{d}");
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); shapes.len()];
    let mut spawn = Vec::new();
    for _ in 0..ROUNDS {
        for (i, dir) in dirs.iter().enumerate() {
            samples[i].push(loopx(
                dir.path(),
                &["quota", "should-run", "--goal-id", "bench"],
            ));
        }
        spawn.extend(spawn_samples(4).into_iter().skip(1));
    }
    let floor = median(spawn);
    println!(
        "should-run, {TODOS} todos and {MONITORS} monitors (median of {ROUNDS}); floor: spawn of `true` {:.2} ms",
        floor.as_secs_f64() * 1e3
    );
    let base = median(samples[0].clone());
    for (shape, s) in shapes.iter().zip(samples) {
        let m = median(s);
        println!(
            "  {shape:<14} {:>6.2} ms  {:>5.2}x spawn  {:>5.2}x without monitors",
            m.as_secs_f64() * 1e3,
            m.as_secs_f64() / floor.as_secs_f64(),
            m.as_secs_f64() / base.as_secs_f64()
        );
    }

    // The sleeping heartbeat: one monitor, checked, next due in an hour.
    let quiet = tempfile::tempdir().unwrap();
    seed(quiet.path(), 0, 0);
    let mut k = loopx::Kernel::open(loopx::paths::ProjectPaths::at(quiet.path())).unwrap();
    let mut new = loopx::kernel::todo::NewTodo::task("hourly metric");
    new.kind = TodoKind::Monitor;
    k.add_monitor(
        &loopx::kernel::Actor::Operator,
        "bench",
        new,
        MonitorSpec::every(HOUR),
    )
    .unwrap();
    k.record_check(
        &loopx::kernel::Actor::Operator,
        "bench",
        "t1",
        &loopx::kernel::monitor::Observation::Value("baseline".into()),
        None,
    )
    .unwrap();
    drop(k);
    let mut beat = Command::new(support::LOOPX)
        .args([
            "loop",
            "--watch",
            "--goal-id",
            "bench",
            "--agent-id",
            "beat",
            "--",
            "true",
        ])
        .current_dir(quiet.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // `loopx` execs `loopx-wasm` in place: the pid stays; let it start and settle into its sleep.
    std::thread::sleep(Duration::from_secs(3));
    let before = cpu_ticks(beat.id());
    let window = Duration::from_secs(60);
    std::thread::sleep(window);
    let after = cpu_ticks(beat.id());
    // SAFETY: a signal to the child this bench spawned.
    unsafe {
        libc::kill(beat.id() as i32, libc::SIGTERM);
    }
    let status = beat.wait().unwrap();
    assert!(
        status.success(),
        "the heartbeat settles on SIGTERM: {status}"
    );
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    println!(
        "sleeping heartbeat: {} clock ticks of CPU ({:.3} s at {hz} Hz) over {} s = {:.4}% of one core",
        after - before,
        (after - before) as f64 / hz,
        window.as_secs(),
        (after - before) as f64 / hz / window.as_secs_f64() * 100.0
    );
}
