//! The core tick as whole processes: `quota should-run`, `todo claim`, `todo complete`,
//! `refresh-state`, `quota spend-slot`, each a fresh `loopx` process, on a goal with 1,000 todos and
//! either 0 or 100,000 history rows. Beside it, in the same run, the physical floor: a process
//! spawn and an fsync on the same disk (back to back, and after the idle gap the tick's commits
//! have between them), and the part of every command that does not depend on the
//! goal's size (start-up alone, should-run on a one-todo project, and a process that only opens
//! the store and reads one row). Run with `cargo bench --bench tick`.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{
    fsync_floor, loopx, manual_tick, median, seed, serve_store_floor, spawn_floor, store_floor,
};

const TODOS: usize = 1_000;
const HISTORY: usize = 100_000;
const ROUNDS: usize = 40;
/// How long the disk is idle before each fsync of the second floor: about the gap between two
/// of the tick's commits, which are a process's work apart.
const IDLE_BEFORE_FSYNC: Duration = Duration::from_millis(5);

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
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
        let start = Instant::now();
        let d = manual_tick(dir, r);
        t.total.push(start.elapsed());
        for (i, x) in d.into_iter().enumerate() {
            t.steps[i].push(x);
        }
    }
    t
}

fn main() {
    serve_store_floor();
    let base = std::env::var_os("LOOPX_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let empty = tempfile::tempdir_in(&base).unwrap();
    let full = tempfile::tempdir_in(&base).unwrap();
    let seed_start = Instant::now();
    drop(seed(empty.path(), TODOS, 0));
    drop(seed(full.path(), TODOS, HISTORY));
    eprintln!(
        "seeded 2 x {TODOS} todos and {HISTORY} history rows in {:.1}s",
        seed_start.elapsed().as_secs_f64()
    );

    // The part of every command that does not depend on the goal's size: a one-todo project.
    let tiny = tempfile::tempdir_in(&base).unwrap();
    drop(seed(tiny.path(), 1, 0));
    let start_up = median(
        (0..ROUNDS)
            .map(|_| loopx(tiny.path(), &["--version"]))
            .collect(),
    );
    let fixed = median(
        (0..ROUNDS)
            .map(|_| loopx(tiny.path(), &["quota", "should-run", "--goal-id", "bench"]))
            .collect(),
    );

    let spawn = spawn_floor(ROUNDS * 2);
    let fsync = fsync_floor(full.path(), ROUNDS * 2, Duration::ZERO);
    let idle_fsync = fsync_floor(full.path(), ROUNDS * 2, IDLE_BEFORE_FSYNC);
    let store = store_floor(full.path(), ROUNDS * 2);
    let a = tick_rounds(empty.path());
    let b = tick_rounds(full.path());
    let floor = spawn * 5 + fsync * 4;
    let idle_floor = spawn * 5 + idle_fsync * 4;

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
    println!("| fsync of 4 KiB, back to back | {} |", ms(fsync));
    println!(
        "| fsync of 4 KiB after {} ms without disk I/O | {} |",
        IDLE_BEFORE_FSYNC.as_millis(),
        ms(idle_fsync)
    );
    println!("| 5 spawns + 4 fsyncs (back to back) | {} |", ms(floor));
    println!("| 5 spawns + 4 fsyncs (after idle) | {} |", ms(idle_floor));
    println!();
    println!("| fixed cost per process, same run | ms |");
    println!("|---|---:|");
    println!(
        "| `loopx --version` (start-up, no database) | {} |",
        ms(start_up)
    );
    println!(
        "| `quota should-run` on a one-todo project | {} |",
        ms(fixed)
    );
    println!(
        "| a process that only opens the store and reads one row | {} |",
        ms(store)
    );
    println!();
    println!(
        "tick / floor: {:.2}x at 0 rows, {:.2}x at {HISTORY} rows (target: within 3x)",
        ta.as_secs_f64() / floor.as_secs_f64(),
        tb.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "tick / floor with fsyncs after idle: {:.2}x at 0 rows, {:.2}x at {HISTORY} rows",
        ta.as_secs_f64() / idle_floor.as_secs_f64(),
        tb.as_secs_f64() / idle_floor.as_secs_f64()
    );
    // Five processes that each only open the store, plus the four commits' fsyncs: the least a
    // five-process tick over SQLite can cost, before any command does its work.
    let store_ticks = store * 5 + fsync * 4;
    println!(
        "5 store-opening processes + 4 fsyncs: {} ms = {:.2}x the floor; tick / that: {:.2}x at 0 rows, {:.2}x at {HISTORY} rows",
        ms(store_ticks),
        store_ticks.as_secs_f64() / floor.as_secs_f64(),
        ta.as_secs_f64() / store_ticks.as_secs_f64(),
        tb.as_secs_f64() / store_ticks.as_secs_f64()
    );
}
