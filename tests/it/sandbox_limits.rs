//! Sandbox limits: each hostile capability behaviour fails with its own named error that names the
//! plugin and the limit, and no row of any table of the database changes (nothing reaches admission).

use crate::support::plugin::{Sandbox, extension, fifo_released_after, wasm};
use loopx::plugin::invoke::{InvokeError, invoke_capability};

const CAP: &str = "hostile/cap";

/// A project with goal `g1` and the hostile capability installed with `limits`.
fn setup(limits: &str, extra: &str) -> Sandbox {
    let mut p = Sandbox::new();
    p.goal("g1");
    let dir = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        extra,
        limits,
    );
    p.install(&dir, &[]).unwrap();
    p
}

/// Invokes the hostile capability and expects failure of `kind`; checks the database is unchanged
/// and the message names the plugin and every `needles` item (the limit).
fn expect_failure(p: &mut Sandbox, payload: &str, kind: &str, needles: &[&str]) -> InvokeError {
    let before = p.fingerprint();
    let err = invoke_capability(
        &mut p.kernel,
        &p.host,
        CAP,
        "g1",
        Some("me"),
        payload.into(),
        false,
    )
    .expect_err("the hostile call must fail");
    assert_eq!(
        err.plugin_kind.map(|k| k.as_str()),
        Some(kind),
        "wrong error kind: {}",
        err.error
    );
    let msg = err.error.to_string();
    assert!(msg.contains(CAP), "error does not name the plugin: {msg}");
    for n in needles {
        assert!(
            msg.contains(n),
            "error does not name the limit '{n}': {msg}"
        );
    }
    assert_eq!(err.error.exit_code(), 1, "limit violations exit 1: {msg}");
    assert_eq!(
        p.fingerprint(),
        before,
        "the database changed after a failed call"
    );
    err
}

/// Expects `payload` to fail with the 300 ms deadline, and the call to return well before the 60 s
/// the guest would otherwise take.
fn expect_deadline(p: &mut Sandbox, payload: &str) {
    let started = std::time::Instant::now();
    expect_failure(p, payload, "deadline", &["300 ms"]);
    assert!(
        started.elapsed().as_secs() < 10,
        "deadline took {:?}",
        started.elapsed()
    );
}

#[test]
fn infinite_loop_is_stopped_by_the_deadline() {
    let mut p = setup("fuel = 20_000_000_000\ndeadline_ms = 300", "");
    expect_deadline(&mut p, "loop");
}

#[test]
fn sleep_inside_a_wasi_call_is_cut_at_the_deadline() {
    // Epoch interruption only stops running wasm; a guest blocked in a host call (here a
    // monotonic-clock wait) must still come back by its deadline.
    let mut p = setup("deadline_ms = 300", "");
    expect_deadline(&mut p, "sleep 60000");
}

#[test]
fn fuel_burn_is_stopped_by_fuel() {
    let mut p = setup("fuel = 5_000_000\ndeadline_ms = 30000", "");
    expect_failure(&mut p, "loop", "fuel_exhausted", &["5000000"]);
}

#[test]
fn memory_growth_past_the_limit_is_refused() {
    let mut p = setup("memory_mib = 16", "");
    expect_failure(&mut p, "grow", "memory_limit", &["16777216"]);
}

#[test]
fn unbounded_recursion_overflows_the_stack() {
    let mut p = setup("", "");
    expect_failure(&mut p, "recurse", "stack_overflow", &["262144"]);
}

#[test]
fn oversized_list_return_is_refused() {
    let mut p = setup("", "");
    expect_failure(
        &mut p,
        "big-list 5000",
        "too_many_items",
        &["5000 proposals", "256"],
    );
}

#[test]
fn oversized_string_return_is_refused() {
    let mut p = setup("", "");
    expect_failure(
        &mut p,
        "big-string 65536",
        "string_too_long",
        &["65536", "8192"],
    );
}

#[test]
fn return_larger_than_the_output_cap_is_refused_while_lifting() {
    let mut p = setup("output_kib = 1024", "");
    expect_failure(
        &mut p,
        "big-string 4000000",
        "output_too_large",
        &["1048576"],
    );
}

#[test]
fn guest_panic_is_a_trap_with_its_message_in_the_log() {
    let mut p = setup("", "");
    let err = expect_failure(&mut p, "panic", "trap", &[]);
    let logs = err.call.expect("call report").logs;
    assert!(
        logs.iter()
            .any(|l| l.stream == "stderr" && l.text.contains("hostile-cap was told to panic")),
        "panic message not captured: {logs:?}"
    );
}

#[test]
fn undeclared_provider_call_fails_the_call() {
    let mut p = setup("", "");
    expect_failure(
        &mut p,
        "call other/prov read x\nok",
        "not_declared",
        &["other/prov"],
    );
}

#[test]
fn provider_call_budget_is_enforced() {
    let mut p = Sandbox::new();
    p.goal("g1");
    let data = p.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let probe = extension(
        p.dir.path(),
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        &["fs.read:data"],
        "",
        "",
    );
    p.install(&probe, &[&format!("fs.read:data={}", data.display())])
        .unwrap();
    let cap = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "uses = [\"probe/p\"]",
        "max_provider_calls = 1",
    );
    p.install(&cap, &[]).unwrap();
    // One call is within budget and succeeds.
    let ok = invoke_capability(
        &mut p.kernel,
        &p.host,
        CAP,
        "g1",
        None,
        "call probe/p list /data".into(),
        true,
    )
    .unwrap();
    assert_eq!(ok.call.provider_calls.len(), 1);
    assert_eq!(ok.call.provider_calls[0].outcome, "ok");
    expect_failure(
        &mut p,
        "call probe/p list /data\ncall probe/p list /data",
        "call_budget",
        &["1 provider calls"],
    );
}

#[test]
fn logs_are_captured_capped_and_stripped_of_escapes() {
    let mut p = setup("log_kib = 1", "");
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        CAP,
        "g1",
        None,
        "log 500\nok".into(),
        true,
    )
    .unwrap();
    let logs = out.call.logs;
    assert!(
        logs.iter().all(|l| !l.text.contains('\u{1b}')),
        "escape sequences leaked"
    );
    assert!(
        logs.iter().any(|l| l.text == "line 0"),
        "log line missing: {:?}",
        &logs[..3.min(logs.len())]
    );
    let bytes: usize = logs.iter().map(|l| l.text.len()).sum();
    assert!(bytes < 1024 + 200, "log cap not applied: {bytes} bytes");
    assert!(
        logs.iter()
            .any(|l| l.stream == "host" && l.text.contains("dropped")),
        "no truncation note"
    );
}

#[test]
fn a_well_behaved_call_is_fast_and_admitted() {
    let mut p = setup("", "");
    let out =
        invoke_capability(&mut p.kernel, &p.host, CAP, "g1", None, "ok".into(), false).unwrap();
    assert_eq!(out.proposals.len(), 1);
    assert_eq!(out.admission.accepted, 1);
    assert!(out.call.fuel_consumed.unwrap() > 0);
}

#[test]
fn every_call_gets_a_fresh_instance_and_memory() {
    let mut p = setup("", "");
    for _ in 0..5 {
        let out = invoke_capability(
            &mut p.kernel,
            &p.host,
            CAP,
            "g1",
            None,
            "count".into(),
            true,
        )
        .unwrap();
        assert_eq!(
            out.proposals,
            vec![loopx::kernel::transition::Transition::NoChange {
                reason: "call 1".into()
            }],
            "guest state leaked between calls"
        );
    }
}

/// Hostile-cap (with `cap_limits`) that may call probe-provider (with `probe_limits`), which is
/// granted `<project>/data`. Returns the project and the granted directory.
fn cap_with_probe(cap_limits: &str, probe_limits: &str) -> (Sandbox, std::path::PathBuf) {
    let mut p = Sandbox::new();
    p.goal("g1");
    let data = p.dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let probe = extension(
        p.dir.path(),
        "probe",
        "provider",
        "p",
        &wasm("probe-provider"),
        &["fs.read:data"],
        "",
        probe_limits,
    );
    p.install(&probe, &[&format!("fs.read:data={}", data.display())])
        .unwrap();
    let cap = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "uses = [\"probe/p\"]",
        cap_limits,
    );
    p.install(&cap, &[]).unwrap();
    (p, data)
}

/// The capability's 2 s deadline bounds the whole call, provider call included, within the
/// documented slack (`DEADLINE_SLACK_MS`, plus scheduling noise on a busy machine).
fn expect_capability_deadline(p: &mut Sandbox, payload: &str) {
    let started = std::time::Instant::now();
    let err = expect_failure(p, payload, "deadline", &["2000 ms"]);
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_millis(2000 + 700),
        "the capability call took {took:?}, past its 2000 ms deadline"
    );
    let calls = &err.call.as_ref().unwrap().provider_calls;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].outcome, "deadline", "{calls:?}");
}

#[test]
fn provider_call_gets_at_most_the_capabilitys_remaining_deadline() {
    let (mut p, _) = cap_with_probe("deadline_ms = 2000", "deadline_ms = 8000");
    expect_capability_deadline(&mut p, "call probe/p sleep 8000\nok");
}

#[test]
fn provider_blocked_in_a_read_cannot_outlive_the_capability() {
    let (mut p, data) = cap_with_probe("deadline_ms = 2000", "deadline_ms = 8000");
    fifo_released_after(&data.join("fifo"), std::time::Duration::from_secs(10));
    expect_capability_deadline(&mut p, "call probe/p read /data/fifo\nok");
}
