//! Two `loopx` binaries timed against each other on the core tick, alternating tick by tick.
//!
//! Why this exists: on the development VM whole-process timings drift over minutes by more than
//! most single changes gain (docs/benchmarks.md), so two `cargo bench --bench tick` runs cannot
//! tell a better binary from a quieter moment. Here both binaries run the same five-command tick on
//! their own copy of the same project, interleaved (A B, then B A, ...), so drift hits both alike.
//!
//! `LOOPX_AB_BASELINE=/path/to/old/loopx cargo bench --bench tick_ab` compares that binary with
//! this build's. Without it the build is compared with itself: the spread of that A/A run is the
//! resolution of the method. Each project is seeded through its own binary's CLI (`init`,
//! `goal create`, 1,000 `todo add`), so binaries with different schema versions compare fairly.
//!
//! Two more variables isolate one part of a difference between builds. `LOOPX_AB_CANDIDATE` runs
//! that binary as B instead of this build (the baseline against itself, say), and
//! `LOOPX_AB_CANDIDATE_SQL` names a file of SQL run on B's project after seeding: the old binary on
//! an old project given the tables and indexes a newer schema added
//! (`benches/fixtures/schema-growth-3a17747.sql`) measures what the schema's size alone costs.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use support::{LOOPX, assert_ticks_done, manual_tick_at, median};

const TODOS: usize = 1_000;
const TICKS: usize = 60;
const STEPS: [&str; 5] = [
    "quota should-run",
    "todo claim",
    "todo complete",
    "refresh-state",
    "quota spend-slot",
];

/// A project in `dir` with goal `bench` and `TODOS` open todos `t1`.., made by `bin` itself.
fn seed_with(bin: &Path, dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new(bin)
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{} {args:?}: {}",
            bin.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init"]);
    run(&["goal", "create", "--id", "bench", "--title", "Bench goal"]);
    for i in 1..=TODOS {
        let title = format!("bench todo {i}");
        let priority = format!("P{}", i % 5);
        run(&[
            "todo",
            "add",
            "--goal-id",
            "bench",
            "--title",
            &title,
            "--priority",
            &priority,
        ]);
    }
    run(&["refresh-state", "--goal-id", "bench"]);
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn main() {
    let new = std::env::var_os("LOOPX_AB_CANDIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(LOOPX));
    let old = std::env::var_os("LOOPX_AB_BASELINE")
        .map(PathBuf::from)
        .unwrap_or_else(|| new.clone());
    let named = [old, new];
    // Each binary runs from a fresh copy: how many pages a process start faults in depends on how
    // the file got into the page cache (a binary the linker wrote through a memory map faulted
    // more pages per process than the same bytes written by `cp`; docs/benchmarks.md), which
    // would otherwise favour whichever binary was copied rather than linked.
    let copies = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let bins = [0, 1].map(|b| {
        let copy = copies[b].path().join("loopx");
        std::fs::copy(&named[b], &copy).unwrap();
        copy
    });
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for (bin, dir) in bins.iter().zip(&dirs) {
        seed_with(bin, dir.path());
    }
    if let Some(sql) = std::env::var_os("LOOPX_AB_CANDIDATE_SQL") {
        let sql = std::fs::read_to_string(&sql)
            .unwrap_or_else(|e| panic!("reading LOOPX_AB_CANDIDATE_SQL {sql:?}: {e}"));
        rusqlite::Connection::open(dirs[1].path().join(".loopx/loopx.db"))
            .and_then(|db| db.execute_batch(&sql))
            .expect("running LOOPX_AB_CANDIDATE_SQL on B's project");
    }
    // steps[binary][step] and totals[binary], one sample per tick.
    let mut steps: [[Vec<Duration>; 5]; 2] = Default::default();
    let mut totals: [Vec<Duration>; 2] = Default::default();
    for r in 0..TICKS {
        let order = if r % 2 == 0 { [0, 1] } else { [1, 0] };
        for b in order {
            let d = manual_tick_at(&bins[b], dirs[b].path(), r);
            totals[b].push(d.iter().sum());
            for (i, x) in d.into_iter().enumerate() {
                steps[b][i].push(x);
            }
        }
    }
    // Both binaries' ticks did their work (outside the timing).
    for (bin, dir) in bins.iter().zip(&dirs) {
        assert_ticks_done(bin, dir.path(), TICKS);
    }
    println!("A = {}", named[0].display());
    println!("B = {} (this build)", named[1].display());
    println!();
    println!("| step ({TODOS} todos, median of {TICKS}, alternating) | A (ms) | B (ms) | B / A |");
    println!("|---|---:|---:|---:|");
    let row = |name: &str, a: Duration, b: Duration| {
        println!(
            "| {name} | {} | {} | {:.3} |",
            ms(a),
            ms(b),
            b.as_secs_f64() / a.as_secs_f64()
        );
    };
    for (i, name) in STEPS.iter().enumerate() {
        row(
            name,
            median(steps[0][i].clone()),
            median(steps[1][i].clone()),
        );
    }
    row(
        "**whole tick**",
        median(totals[0].clone()),
        median(totals[1].clone()),
    );
}
