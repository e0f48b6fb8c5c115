//! The dashboard's server time at 1,000 todos and 100,000 runs, history pages against history
//! length, and requests per second over HTTP (`wrk`) beside `loopx status` as a process.
//!
//! Two projects, seeded through the library in one transaction each: both with 1,000 open todos,
//! one with 1,000 runs and one with 100,000. Each round asks the router in-process (no socket:
//! server time only) for the attention queue (`/api/v1/status`), the goal page's three answers
//! (goal with its todos, gates, quota) and two history pages (the newest, and one 500 runs
//! back), alternating the projects; it prints the medians and the long/short ratio of the
//! history pages (1.0 is constant cost in history length). The long project also holds 100,000
//! quota ledger rows older than the window (both hold the same 200 spends inside it), so the
//! quota row's ratio is the spend series' cost against ledger history. Then, when `wrk` is installed, the
//! `loopx-serve` binary on the 1,000-todo project under `wrk -t2 -c8 -d5s`, beside
//! `loopx status --format json` run as a process and a spawn of `true`, both per second.
//!
//! Run with `cargo bench -p loopx-serve --bench dashboard` (release build; about a minute).

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use loopx::kernel::goal::NewGoal;
use loopx::kernel::{Actor, Kernel};
use loopx::model::{
    LedgerEntry, LedgerKind, Priority, QuotaPolicy, Role, Run, Todo, TodoKind, TodoStatus,
};
use loopx::paths::ProjectPaths;
use loopx_serve::{Config, router};
use tower::ServiceExt;

const TODOS: usize = 1_000;
/// Spends inside the quota window, in both projects.
const WINDOW_SPENDS: usize = 200;
const ROUNDS: usize = 31;
const HOST: &str = "127.0.0.1:7878";

/// A project with goal `bench`, `todos` open todos, `runs` run rows, [`WINDOW_SPENDS`] spends
/// spread over the quota window and `old_spends` ledger rows dated before it (the shape of the
/// root crate's `benches/support` seed, which this crate cannot include: it names the `loopx`
/// binary).
fn seed(dir: &Path, todos: usize, runs: usize, old_spends: usize) {
    Kernel::init(dir).unwrap().expect("fresh project");
    let mut k = Kernel::open(ProjectPaths::at(dir)).unwrap();
    let goal = NewGoal {
        id: Some("bench".into()),
        title: "Bench goal".into(),
        ..NewGoal::default()
    };
    k.create_goal(&Actor::Operator, goal).unwrap();
    let now = loopx::clock::now_ms();
    k.write(|tx| {
        for i in 0..todos {
            tx.insert_todo(&Todo {
                id: format!("t{}", i + 1),
                goal_id: "bench".into(),
                role: Role::Agent,
                kind: TodoKind::Task,
                title: format!("bench todo {i}"),
                detail: String::new(),
                priority: Priority::from_rank((i % 5) as i64).expect("0 to 4 are ranks"),
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
        let window = QuotaPolicy::default().window_ms();
        let spend = |i: usize, at: i64| LedgerEntry {
            effect_id: format!("spend-{i}"),
            goal_id: "bench".into(),
            agent_id: Some(format!("hist-{}", i % 7)),
            run_id: None,
            slots: 1,
            kind: LedgerKind::Spend,
            voids_effect_id: None,
            created_at: at,
        };
        for i in 0..old_spends {
            tx.insert_ledger(&spend(i, now - 2 * window - i as i64 * 1_000))?;
        }
        let step = window / (WINDOW_SPENDS as i64 + 1);
        for i in 0..WINDOW_SPENDS {
            tx.insert_ledger(&spend(old_spends + i, now - 1_000 - i as i64 * step))?;
        }
        // As every spend does: the window's count moved to its start.
        for agent in (0..7).map(|a| format!("hist-{a}")) {
            tx.move_quota_window("bench", Some(&agent), now - window)?;
        }
        Ok(())
    })
    .unwrap();
}

fn app(dir: &Path) -> Router {
    let (changes, _) = tokio::sync::broadcast::channel(4);
    router(
        Config {
            paths: ProjectPaths::at(dir),
            listen: HOST.parse::<SocketAddr>().unwrap(),
            token: None,
        },
        changes,
    )
}

/// One request through the router; returns the time to the last byte of the body and the body.
async fn timed(app: &Router, uri: &str) -> (Duration, serde_json::Value) {
    let request = Request::builder()
        .uri(uri)
        .header(header::HOST, HOST)
        .body(Body::empty())
        .unwrap();
    let start = Instant::now();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let took = start.elapsed();
    assert_eq!(
        status,
        StatusCode::OK,
        "{uri}: {}",
        String::from_utf8_lossy(&body)
    );
    (took, serde_json::from_slice(&body).unwrap())
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The history page `back` runs before the newest of a project with `runs` runs.
fn page_back(runs: usize, back: usize) -> String {
    format!(
        "/api/v1/goals/bench/history?limit=20&before=00H{:023}",
        runs - back
    )
}

fn main() {
    let short_dir = tempfile::tempdir().unwrap();
    let long_dir = tempfile::tempdir().unwrap();
    let seeding = Instant::now();
    seed(short_dir.path(), TODOS, 1_000, 0);
    seed(long_dir.path(), TODOS, 100_000, 100_000);
    println!("seeded in {:.1} s", seeding.elapsed().as_secs_f64());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let routes: Vec<(&str, String, String)> = vec![
        (
            "attention queue",
            "/api/v1/status".into(),
            "/api/v1/status".into(),
        ),
        (
            "goal + todos",
            "/api/v1/goals/bench".into(),
            "/api/v1/goals/bench".into(),
        ),
        (
            "gates",
            "/api/v1/goals/bench/gates".into(),
            "/api/v1/goals/bench/gates".into(),
        ),
        (
            "quota",
            "/api/v1/goals/bench/quota".into(),
            "/api/v1/goals/bench/quota".into(),
        ),
        (
            "history, newest",
            "/api/v1/goals/bench/history?limit=20".into(),
            "/api/v1/goals/bench/history?limit=20".into(),
        ),
        (
            "history, 500 back",
            page_back(1_000, 500),
            page_back(100_000, 500),
        ),
    ];
    let (short, long) = (app(short_dir.path()), app(long_dir.path()));
    println!(
        "{:<18} {:>12} {:>12} {:>7}",
        "route (server)", "1k runs ms", "100k runs ms", "ratio"
    );
    let mut goal_page = [Duration::ZERO; 2];
    for (name, short_uri, long_uri) in &routes {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        runtime.block_on(async {
            for round in 0..ROUNDS {
                // Alternating which project goes first, so neither always meets a warm cache.
                let order = [(&short, short_uri, &mut a), (&long, long_uri, &mut b)];
                let order: Vec<_> = if round % 2 == 0 {
                    order.into_iter().collect()
                } else {
                    order.into_iter().rev().collect()
                };
                for (app, uri, out) in order {
                    let (took, body) = timed(app, uri).await;
                    check(uri, &body);
                    out.push(took);
                }
            }
        });
        let (a, b) = (median(a), median(b));
        if ["goal + todos", "gates", "quota"].contains(name) {
            goal_page[0] += a;
            goal_page[1] += b;
        }
        println!(
            "{name:<18} {:>12.2} {:>12.2} {:>7.2}",
            ms(a),
            ms(b),
            b.as_secs_f64() / a.as_secs_f64()
        );
    }
    println!(
        "{:<18} {:>12.2} {:>12.2} {:>7.2}",
        "goal page (3 req)",
        ms(goal_page[0]),
        ms(goal_page[1]),
        goal_page[1].as_secs_f64() / goal_page[0].as_secs_f64()
    );
    wrk_side_by_side(short_dir.path());
}

/// What each answer must hold, so a fast error page cannot pass for a fast page.
fn check(uri: &str, body: &serde_json::Value) {
    if uri.ends_with("/goals/bench") {
        assert_eq!(body["todos"].as_array().unwrap().len(), TODOS);
    } else if uri.contains("/history") {
        assert_eq!(body["runs"].as_array().unwrap().len(), 20, "{uri}");
    } else if uri.ends_with("/quota") {
        let spans = body["spend_series"]["net_slots"].as_array().unwrap();
        let total: i64 = spans.iter().map(|n| n.as_i64().unwrap()).sum();
        assert_eq!((spans.len(), total), (48, WINDOW_SPENDS as i64), "{uri}");
        assert_eq!(body["quota"]["spent_slots"], WINDOW_SPENDS as i64, "{uri}");
    } else if uri.ends_with("/status") {
        assert_eq!(body["goals"].as_array().unwrap().len(), 1);
    }
}

/// `wrk` against the served API beside `loopx status --format json` as a process.
fn wrk_side_by_side(dir: &Path) {
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("wrk is not installed (apt-get install -y wrk): requests per second not measured");
        return;
    }
    // Beside the bench's own `deps/` (not `env!("CARGO_BIN_EXE_loopx-serve")`: the rustc wrapper,
    // `.cargo/static-bins`, runs under `/bin/sh`, which drops variables whose names hold a `-`).
    let exe = std::env::current_exe().unwrap();
    let server_bin = exe.parent().unwrap().parent().unwrap().join("loopx-serve");
    let loopx = server_bin.with_file_name("loopx");
    let mut server = Command::new(&server_bin)
        .arg("--root")
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(server.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line.trim().rsplit(" at ").next().unwrap().to_string();
    for path in ["api/v1/status", "api/v1/goals/bench/history?limit=20"] {
        let out = Command::new("wrk")
            .args(["-t2", "-c8", "-d5s"])
            .arg(format!("{url}{path}"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let rps = text
            .lines()
            .find(|l| l.starts_with("Requests/sec:"))
            .unwrap_or("Requests/sec: ?");
        assert!(
            !text.contains("Non-2xx"),
            "wrk saw errors on /{path}:\n{text}"
        );
        println!("wrk -t2 -c8 -d5s /{path}: {}", rps.trim());
    }
    let _ = server.kill();
    let _ = server.wait();
    let per_second = |cmd: &mut Command| {
        let xs: Vec<Duration> = (0..ROUNDS)
            .map(|_| {
                let start = Instant::now();
                let out = cmd.output().unwrap();
                assert!(out.status.success(), "{cmd:?}");
                start.elapsed()
            })
            .collect();
        1.0 / median(xs).as_secs_f64()
    };
    if loopx.is_file() {
        let status = per_second(
            Command::new(&loopx)
                .arg("--root")
                .arg(dir)
                .args(["status", "--format", "json"])
                .env_remove("LD_LIBRARY_PATH"),
        );
        println!("loopx status --format json as a process, one after another: {status:.0}/s");
    } else {
        println!(
            "{} is not built: the process comparison is missing",
            loopx.display()
        );
    }
    let spawn = per_second(Command::new("true").env_remove("LD_LIBRARY_PATH"));
    println!("spawning `true`, one after another (the floor of any process): {spawn:.0}/s");
}
