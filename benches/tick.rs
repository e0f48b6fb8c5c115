//! The core tick as whole processes: `quota should-run`, `todo claim`, `todo complete`,
//! `refresh-state`, `quota spend-slot`, each a fresh `loopx` process, on a goal with 1,000 todos and
//! either 0 or 100,000 history rows. Beside it, in the same run, the physical floor: a process
//! spawn and an fsync on the same disk (back to back, and after the idle gap the tick's commits
//! have between them), and the part of every command that does not depend on the
//! goal's size (start-up alone, should-run on a one-todo project, and `loopx probe show`, which
//! only opens the store and reads one row). Run with `cargo bench --bench tick`.
//!
//! Timings on the development VM drift over minutes (docs/benchmarks.md), so nothing here is
//! measured in a block of its own: each round runs a tick on both projects (in alternating order)
//! and then a short tight loop of every floor, and each figure is the median over all rounds. The
//! ratios and the 0-versus-100,000 comparison therefore set numbers from the same minutes against
//! each other. The floors' medians come from the tight loops (the physical limit); the same
//! operations run in the tick's order, with the pauses that order brings, are reported beside them.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::{
    assert_ticks_done, floor_sequence, fsync_samples, loopx, manual_tick, median, seed,
    spawn_samples, store_samples,
};

const TODOS: usize = 1_000;
const HISTORY: usize = 100_000;
const ROUNDS: usize = 40;
/// Samples of each floor taken per round, back to back.
const FLOOR_SAMPLES: usize = 4;
/// How long the disk is idle before each fsync of the second floor: about the gap between two
/// of the tick's commits, which are a process's work apart.
const IDLE_BEFORE_FSYNC: Duration = Duration::from_millis(5);

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

#[derive(Default)]
struct Tick {
    steps: [Vec<Duration>; 5],
    total: Vec<Duration>,
}

impl Tick {
    fn run(&mut self, dir: &Path, r: usize) {
        let start = Instant::now();
        let d = manual_tick(dir, r);
        self.total.push(start.elapsed());
        for (i, x) in d.into_iter().enumerate() {
            self.steps[i].push(x);
        }
    }
}

/// Every sample of one run, gathered round by round.
#[derive(Default)]
struct Samples {
    /// Ticks on the project with 0 and with `HISTORY` history rows.
    ticks: [Tick; 2],
    spawn: Vec<Duration>,
    fsync: Vec<Duration>,
    idle_fsync: Vec<Duration>,
    store: Vec<Duration>,
    sequence: Vec<Duration>,
    start_up: Vec<Duration>,
    fixed: Vec<Duration>,
}

fn main() {
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
    let should_run_tiny = ["quota", "should-run", "--goal-id", "bench"];

    let mut s = Samples::default();
    for r in 0..ROUNDS {
        let projects = [empty.path(), full.path()];
        for k in [r % 2, 1 - r % 2] {
            s.ticks[k].run(projects[k], r);
        }
        // The first spawn and fsync of each loop follow the tick's pauses; the floor is the
        // loop's steady state, so they are left out (which makes the ratio stricter).
        s.spawn
            .extend(spawn_samples(FLOOR_SAMPLES + 1).into_iter().skip(1));
        s.fsync.extend(
            fsync_samples(full.path(), FLOOR_SAMPLES + 1, Duration::ZERO)
                .into_iter()
                .skip(1),
        );
        s.idle_fsync
            .extend(fsync_samples(full.path(), 1, IDLE_BEFORE_FSYNC));
        s.store.extend(store_samples(full.path(), FLOOR_SAMPLES));
        s.sequence.push(floor_sequence(full.path()));
        s.start_up.push(loopx(tiny.path(), &["--version"]));
        s.fixed.push(loopx(tiny.path(), &should_run_tiny));
    }
    // Every tick did its work (outside the timing).
    for project in [empty.path(), full.path()] {
        assert_ticks_done(std::path::Path::new(support::LOOPX), project, ROUNDS);
    }
    let [a, b] = s.ticks;
    let spawn = median(s.spawn);
    let fsync = median(s.fsync);
    let idle_fsync = median(s.idle_fsync);
    let store = median(s.store);
    let sequence = median(s.sequence);
    let start_up = median(s.start_up);
    let fixed = median(s.fixed);
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
    println!(
        "| 5 spawns + 4 fsyncs run in the tick's order, timed as a whole | {} |",
        ms(sequence)
    );
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
        "| `loopx probe show`: opens the store, reads one row | {} |",
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
    println!(
        "tick / the floor run in the tick's order: {:.2}x at 0 rows, {:.2}x at {HISTORY} rows",
        ta.as_secs_f64() / sequence.as_secs_f64(),
        tb.as_secs_f64() / sequence.as_secs_f64()
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
