//! Plugin host benchmark (harness = false): what a capability call costs.
//!
//! Run: `cargo bench --bench plugin` (release build). It builds the guest components it needs with
//! `cargo build --release --target wasm32-wasip2 -p hostile-cap` first (a no-op when up
//! to date). Measured, in one run:
//!
//! * install-time compile (`Engine::precompile_component`) of the capability component;
//! * precompiled load: sha256 of the installed `.wasm` + verified `.cwasm` deserialize + import audit
//!   + `InstancePre` (everything `PluginHost::load` does);
//! * empty instantiation: a fresh `Store` + instantiation of an empty component (the floor);
//! * capability instantiation only (fresh store with all limits, no call);
//! * warm `propose` with a fresh store per call (the per-call cost the turn driver pays).
//!
//! Figures are medians (and p90) over many iterations; this is a noisy 2-vCPU VM, so compare rows
//! within one run rather than across runs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use loopx::model::{Priority, TodoKind, TodoStatus};
use loopx::plugin::cache::{ComponentCache, sha256_hex};
use loopx::plugin::engine::engine;
use loopx::plugin::manifest::{Kind, Limits};
use loopx::plugin::{CapabilityInput, GoalView, LoadedPlugin, TodoView};
use wasmtime::Store;
use wasmtime::component::{Component, Linker};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn build_guests() -> PathBuf {
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(root())
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            "hostile-cap",
        ])
        .status()
        .expect("running cargo build for the guest components");
    assert!(status.success(), "building the guest components failed");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"));
    target.join("wasm32-wasip2").join("release")
}

fn stats(mut samples: Vec<Duration>) -> (Duration, Duration, usize) {
    samples.sort();
    let n = samples.len();
    (samples[n / 2], samples[(n * 9) / 10], n)
}

fn measure(iters: usize, mut f: impl FnMut()) -> (Duration, Duration, usize) {
    for _ in 0..iters.min(20) {
        f();
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        f();
        samples.push(t.elapsed());
    }
    stats(samples)
}

fn fmt(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

fn goal() -> GoalView {
    GoalView {
        goal_id: "bench-goal".into(),
        title: "Benchmark goal".into(),
        objective: "measure the plugin host".into(),
        success_criteria: vec!["fast".into()],
        todos: (0..10)
            .map(|i| TodoView {
                id: format!("todo-{i}"),
                title: format!("Todo number {i}"),
                detail: "some detail text".into(),
                status: TodoStatus::Open,
                priority: Priority::P2,
                kind: TodoKind::Task,
                lane: Some("patch".into()),
                depends_on: vec![],
                claim_holder: None,
                capability: None,
            })
            .collect(),
    }
}

fn main() {
    let dir = build_guests();
    let wasm_path = dir.join("hostile_cap.wasm");
    let wasm = std::fs::read(&wasm_path).expect("reading hostile_cap.wasm");
    let engine = engine();
    let mut rows: Vec<(String, (Duration, Duration, usize), &str)> = Vec::new();

    // Install-time compile.
    let compile = measure(3, || {
        engine.precompile_component(&wasm).expect("compiling");
    });
    rows.push((
        "install-time compile (precompile_component)".into(),
        compile,
        "reported",
    ));

    // Precompiled load, exactly as PluginHost::load does it.
    let tmp = std::env::temp_dir().join(format!("loopx-bench-{}", std::process::id()));
    let cache = ComponentCache::new(tmp.join("cache"), engine);
    let installed = tmp.join("hostile-cap.wasm");
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(&installed, &wasm).unwrap();
    let sha = sha256_hex(&wasm);
    let artifact_sha = cache
        .compile(engine, "bench/cap", &wasm, &sha)
        .unwrap()
        .artifact_sha256;
    let limits = Limits::defaults(Kind::Capability);
    let load = |path: &Path| {
        let bytes = std::fs::read(path).unwrap();
        assert_eq!(sha256_hex(&bytes), sha);
        let component = cache
            .load_recorded(engine, "bench/cap", &sha, &artifact_sha)
            .unwrap()
            .unwrap();
        LoadedPlugin::new(
            engine,
            &component,
            "bench/cap",
            Kind::Capability,
            limits,
            vec![],
            vec![],
        )
        .unwrap()
    };
    let load_row = measure(50, || {
        load(&installed);
    });
    rows.push((
        "precompiled load (hash + deserialize + audit + InstancePre)".into(),
        load_row,
        "< 5 ms",
    ));
    let deser = measure(50, || {
        cache
            .load_recorded(engine, "bench/cap", &sha, &artifact_sha)
            .unwrap()
            .unwrap();
    });
    rows.push(("  of which verified .cwasm deserialize".into(), deser, ""));

    // Empty instantiation floor.
    let empty = Component::new(engine, "(component)").unwrap();
    let linker: Linker<()> = Linker::new(engine);
    let empty_pre = linker.instantiate_pre(&empty).unwrap();
    let empty_row = measure(2000, || {
        let mut store = Store::new(engine, ());
        empty_pre.instantiate(&mut store).unwrap();
    });
    rows.push((
        "empty component: fresh Store + instantiate".into(),
        empty_row,
        "floor",
    ));

    // Warm propose with a fresh store per call.
    let cap = load(&installed);
    let input = CapabilityInput {
        goal: goal(),
        agent_id: Some("agent".into()),
        payload: "ok".into(),
    };
    let describe_row = measure(2000, || {
        let (r, _) = cap.describe();
        r.unwrap();
    });
    rows.push((
        "capability: fresh Store + instantiate + describe".into(),
        describe_row,
        "",
    ));
    let propose_row = measure(2000, || {
        let (r, _) = cap.propose(&input, HashMap::new());
        assert_eq!(r.unwrap().len(), 1);
    });
    rows.push((
        "warm propose (fresh Store, 10-todo snapshot)".into(),
        propose_row,
        "< 100 µs",
    ));

    let (_, report) = cap.propose(&input, HashMap::new());

    println!();
    println!(
        "LoopX plugin host benchmark ({} bytes component, wasmtime 48.0.8, release)",
        wasm.len()
    );
    println!(
        "{:<62} {:>11} {:>11} {:>7}  target",
        "measurement", "median", "p90", "n"
    );
    println!("{}", "-".repeat(104));
    for (name, (median, p90, n), target) in &rows {
        println!(
            "{name:<62} {:>11} {:>11} {n:>7}  {target}",
            fmt(*median),
            fmt(*p90)
        );
    }
    println!();
    println!(
        "fuel consumed by one propose(\"ok\"): {:?} units",
        report.fuel_consumed
    );
    let _ = std::fs::remove_dir_all(&tmp);
}
