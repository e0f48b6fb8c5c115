//! Per-turn overhead of the turn driver, beside the same work as separate CLI commands.
//!
//! On a goal with 1,000 open todos, with a trivial host (`/bin/echo` printing a minimal valid
//! `completed` result, so every turn claims, completes with one evidence item, records a run,
//! spends and releases) and the built-in capability:
//!
//! * `driver (library)`: `loopx::runtime::run_turn` in-process, all six phases journaled;
//! * `host alone`: the same `/bin/echo` spawned directly (the floor the driver cannot go below);
//! * `driver overhead`: the difference of the two medians;
//! * `loopx turn run` as a whole process (process start + open + the turn);
//! * the manual tick as separate processes: `quota should-run`, `todo claim`, `todo complete`,
//!   `refresh-state`, `quota spend-slot`.
//!
//! * the library driver again with the project on tmpfs (`/dev/shm`), where fsync is nearly free:
//!   the driver's own cost without the disk's durability floor (7 commits = 7 fsyncs).
//!
//! Run with `cargo bench --bench turn` (release profile). Medians over ROUNDS turns.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use loopx::runtime::{TurnRequest, TurnResultKind, run_turn};
use support::{
    assert_ticks_done, assert_turns_completed, fsync_samples, loopx, manual_tick, median, seed,
};

const TODOS: usize = 1_000;
const ROUNDS: usize = 60;
const RESULT: &str = r#"{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"bench","evidence":[{"text":"bench evidence"}]}"#;

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn host_argv() -> Vec<String> {
    vec!["/bin/echo".to_string(), RESULT.to_string()]
}

fn main() {
    // 1. The driver in-process.
    let dir = tempfile::tempdir().unwrap();
    let mut k = seed(dir.path(), TODOS, 0);
    let mut req = TurnRequest::new("bench", "bench-agent", host_argv());
    req.trust_host_completion = true;
    req.timeout_seconds = 30;
    let mut lib = Vec::new();
    let mut steps: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    let mut work = Vec::new();
    for _ in 0..ROUNDS {
        let s = Instant::now();
        let o = run_turn(&mut k, &req).unwrap();
        let took = s.elapsed();
        lib.push(took);
        assert_eq!(o.kind, Some(TurnResultKind::ValidatedCompletion), "{o:?}");
        let rec = loopx::turn::inspect(&mut k, o.turn_key.as_deref().unwrap()).unwrap();
        let mut sum = Duration::ZERO;
        for (step, us) in rec.data["timings_us"].as_object().unwrap() {
            let d = Duration::from_micros(us.as_u64().unwrap());
            sum += d;
            steps.entry(step.clone()).or_default().push(d);
        }
        work.push(sum);
    }
    // 1b. The same on tmpfs (fsync ≈ free): the driver's own cost without the disk's durability
    // floor.
    let shm = std::path::Path::new("/dev/shm");
    let tmpfs: Option<Duration> = shm.is_dir().then(|| {
        let dir = tempfile::tempdir_in(shm).unwrap();
        let mut k = seed(dir.path(), TODOS, 0);
        let xs = (0..ROUNDS)
            .map(|_| {
                let s = Instant::now();
                let o = run_turn(&mut k, &req).unwrap();
                assert_eq!(o.kind, Some(TurnResultKind::ValidatedCompletion));
                s.elapsed()
            })
            .collect();
        median(xs)
    });
    // 2. The host alone.
    let host: Vec<Duration> = (0..ROUNDS)
        .map(|_| {
            let s = Instant::now();
            let out = Command::new("/bin/echo").arg(RESULT).output().unwrap();
            assert!(out.status.success());
            s.elapsed()
        })
        .collect();
    // 3. `loopx turn run` as a process, isolated (namespaces + agent channel, the default where
    // the OS allows) and with `--isolation off`, alternating round by round so that drift in the
    // machine's speed falls on both alike.
    let dir2 = tempfile::tempdir().unwrap();
    drop(seed(dir2.path(), TODOS, 0));
    let turn_run = |isolation: &str| {
        [
            "turn",
            "run",
            "--goal-id",
            "bench",
            "--agent-id",
            "bench-agent",
            "--isolation",
            isolation,
            "--trust-host-completion",
            "--timeout-seconds",
            "30",
            "--",
            "/bin/echo",
            RESULT,
        ]
        .map(str::to_string)
    };
    let isolated = Command::new(support::LOOPX)
        .arg("--format")
        .arg("json")
        .args(turn_run("auto"))
        .current_dir(dir2.path())
        .output()
        .unwrap();
    assert!(
        isolated.status.success(),
        "{}",
        String::from_utf8_lossy(&isolated.stderr)
    );
    let isolation = serde_json::from_slice::<serde_json::Value>(&isolated.stdout).unwrap()["turn"]
        ["isolation"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let (mut cli, mut cli_off) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let args = turn_run("auto");
        cli.push(loopx(dir2.path(), &args.each_ref().map(String::as_str)));
        let args = turn_run("off");
        cli_off.push(loopx(dir2.path(), &args.each_ref().map(String::as_str)));
    }
    // 4. The same work as five separate commands.
    let dir3 = tempfile::tempdir().unwrap();
    drop(seed(dir3.path(), TODOS, 0));
    let d = dir3.path();
    let mut manual = Vec::new();
    for r in 0..ROUNDS {
        let s = Instant::now();
        manual_tick(d, r);
        manual.push(s.elapsed());
    }
    let fsync = median(fsync_samples(dir.path(), ROUNDS, Duration::ZERO));
    let (lib_m, host_m) = (median(lib.clone()), median(host));
    let commits: Vec<Duration> = lib
        .iter()
        .zip(&work)
        .map(|(t, w)| t.saturating_sub(*w))
        .collect();
    println!("turn driver, {TODOS} todos, {ROUNDS} turns each, medians (release build)");
    println!("  driver (library run_turn, 6 phases)  {}", ms(lib_m));
    println!("  host alone (/bin/echo spawn)         {}", ms(host_m));
    println!(
        "  driver overhead (difference)         {}   target < 15 ms",
        ms(lib_m.saturating_sub(host_m))
    );
    println!(
        "  of which 7 commits (start + 6 phases) {}   fsync floor on this disk {} each",
        ms(median(commits)),
        ms(fsync)
    );
    if let Some(t) = tmpfs {
        println!(
            "  same driver on tmpfs (fsync ~ 0)     {}   overhead {}",
            ms(t),
            ms(t.saturating_sub(host_m))
        );
    }
    println!("  per step before its commit (work + transaction body):");
    for (step, xs) in steps {
        println!("    {step:<20} {}", ms(median(xs)));
    }
    let (cli_m, off_m) = (median(cli), median(cli_off));
    println!(
        "  `loopx turn run` process             {}   isolation {isolation}",
        ms(cli_m)
    );
    println!(
        "  the same with --isolation off        {}   isolation adds {} a turn (target < 5 ms)",
        ms(off_m),
        ms(cli_m.saturating_sub(off_m))
    );
    println!(
        "  5 separate CLI commands              {}   (should-run, claim, complete, refresh-state, spend-slot)",
        ms(median(manual))
    );
    // Every timed turn and every tick did its work (checked after the timing).
    assert_turns_completed(dir2.path(), ROUNDS);
    assert_ticks_done(std::path::Path::new(support::LOOPX), d, ROUNDS);
}
