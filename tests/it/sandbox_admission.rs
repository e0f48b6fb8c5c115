//! Kernel admission of capability proposals: a proposal on another agent's leased todo, on another
//! goal's todo, or closing a gate is refused (goal state unchanged, refusal recorded in the run log);
//! a dry run writes nothing; and the first-party issue-fix capability, fed by the fs-observe
//! provider, plans failing tests as a feasibility → patch → checks → review chain with evidence.

use crate::support::plugin::{Sandbox, extension, repo, wasm};
use loopx::kernel::claim::ClaimRequest;
use loopx::kernel::todo::NewTodo;
use loopx::kernel::{Actor, Kernel};
use loopx::model::{GateScope, TodoKind, TodoStatus};
use loopx::plugin::invoke::invoke_capability;

fn with_hostile() -> Sandbox {
    let mut p = Sandbox::new();
    p.goal("g1");
    let dir = extension(
        p.dir.path(),
        "hostile",
        "capability",
        "cap",
        &wasm("hostile-cap"),
        &[],
        "",
        "",
    );
    p.install(&dir, &[]).unwrap();
    p
}

fn todo(kernel: &mut Kernel, goal: &str, id: &str) {
    let mut t = NewTodo::task(format!("todo {id}"));
    t.id = Some(id.into());
    kernel.add_todo(&Actor::Operator, goal, t).unwrap();
}

/// Invokes the hostile capability as agent `me` with `payload`; expects every proposal refused
/// with a reason containing `needle`, goal state unchanged, and the refusal in the run log.
fn expect_refused(p: &mut Sandbox, payload: &str, needle: &str) {
    let before = p.state_fingerprint();
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        Some("me"),
        payload.into(),
        false,
    )
    .expect("the call itself succeeds; admission refuses");
    assert_eq!(out.admission.accepted, 0, "{:?}", out.admission.verdicts);
    assert!(out.admission.refused >= 1);
    for v in &out.admission.verdicts {
        assert!(!v.accepted);
        assert!(
            v.reason.contains(needle),
            "reason '{}' does not mention '{needle}'",
            v.reason
        );
    }
    assert_eq!(
        p.state_fingerprint(),
        before,
        "a refused proposal changed goal state"
    );
    let run_id = out
        .admission
        .run_id
        .expect("refusals are recorded in the run log");
    assert!(
        p.kernel.run("g1", &run_id).unwrap().is_some(),
        "run {run_id} not in the run log"
    );
}

#[test]
fn proposals_on_another_agents_leased_todo_are_refused() {
    let mut p = with_hostile();
    todo(&mut p.kernel, "g1", "t1");
    p.kernel
        .claim(&ClaimRequest {
            goal_id: "g1".into(),
            todo_id: Some("t1".into()),
            agent_id: "other".into(),
            ttl_seconds: 600,
            idempotency_key: None,
        })
        .unwrap();
    expect_refused(&mut p, "complete t1", "other");
    expect_refused(&mut p, "block t1", "other");
    expect_refused(&mut p, "evidence t1", "other");
}

#[test]
fn proposals_on_another_goals_todo_are_refused() {
    let mut p = with_hostile();
    p.goal("g2");
    todo(&mut p.kernel, "g2", "t2");
    expect_refused(&mut p, "complete t2", "no todo 't2' in goal 'g1'");
    expect_refused(&mut p, "evidence t2", "no todo 't2' in goal 'g1'");
}

#[test]
fn closing_a_gate_is_refused() {
    let mut p = with_hostile();
    let mut gate = NewTodo::task("approve the release");
    gate.id = Some("gate1".into());
    gate.kind = TodoKind::UserGate;
    gate.gate_scope = Some(GateScope::Global);
    p.kernel.add_todo(&Actor::Operator, "g1", gate).unwrap();
    expect_refused(&mut p, "complete gate1", "gate");
    expect_refused(&mut p, "block gate1", "gate");
    let (g, _) = p.kernel.todo("g1", "gate1").unwrap();
    assert_ne!(g.status, TodoStatus::Completed);
}

fn with_issue_fix(results: &str) -> Sandbox {
    let mut p = Sandbox::new();
    p.goal("g1");
    let ws = p.dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(ws.join("test-results.txt"), results).unwrap();
    // Make sure both first-party components are built, then install them from extensions/.
    wasm("fs-observe");
    wasm("issue-fix");
    let grant = format!("fs.read:workspace={}", ws.display());
    p.install(&repo().join("extensions/fs-observe"), &[&grant])
        .unwrap();
    p.install(&repo().join("extensions/issue-fix"), &[])
        .unwrap();
    p
}

const RESULTS: &str = "running 3 tests\n\
test parser::empty_input ... FAILED\n\
test parser::nested ... ok\n\
test lexer::unicode ... FAILED\n\
\n\
test result: FAILED. 1 passed; 2 failed\n";

#[test]
fn dry_run_writes_nothing() {
    let mut p = with_issue_fix(RESULTS);
    let before = p.fingerprint();
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        "issue-fix/issue-fix",
        "g1",
        None,
        "issue = crash".into(),
        true,
    )
    .unwrap();
    assert!(out.admission.dry_run);
    assert!(out.admission.accepted >= 5, "{:?}", out.admission.verdicts);
    assert_eq!(p.fingerprint(), before, "a dry run changed the database");
}

#[test]
fn issue_fix_plans_failing_tests_across_lanes_with_evidence() {
    let mut p = with_issue_fix(RESULTS);
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        "issue-fix/issue-fix",
        "g1",
        None,
        "issue = Parser crashes on empty input\nresults = test-results.txt".into(),
        false,
    )
    .unwrap();
    assert_eq!(out.admission.refused, 0, "{:?}", out.admission.verdicts);
    assert_eq!(out.call.provider_calls.len(), 1);
    assert_eq!(out.call.provider_calls[0].outcome, "ok");
    assert!(
        out.call.logs.iter().any(|l| l.plugin == "fs-observe/fs"),
        "the provider's log lines belong to the capability call: {:?}",
        out.call.logs
    );
    let todos = p.kernel.todos("g1").unwrap();
    let lane = |l: &str| {
        todos
            .iter()
            .filter(|t| t.lane.as_deref() == Some(l))
            .collect::<Vec<_>>()
    };
    let (feas, patch, checks, review) = (
        lane("feasibility"),
        lane("patch"),
        lane("checks"),
        lane("review"),
    );
    assert_eq!(
        (feas.len(), patch.len(), checks.len(), review.len()),
        (1, 2, 1, 1)
    );
    assert!(
        patch
            .iter()
            .all(|t| t.depends_on == vec![feas[0].id.clone()])
    );
    let mut patch_ids: Vec<String> = patch.iter().map(|t| t.id.clone()).collect();
    let mut check_deps = checks[0].depends_on.clone();
    patch_ids.sort();
    check_deps.sort();
    assert_eq!(check_deps, patch_ids);
    assert_eq!(review[0].depends_on, vec![checks[0].id.clone()]);
    assert!(
        patch
            .iter()
            .any(|t| t.title.contains("parser::empty_input"))
    );
    let (_, evidence) = p.kernel.todo("g1", &feas[0].id).unwrap();
    assert_eq!(evidence.len(), 1);
    assert!(
        evidence[0].text.contains("2 failing"),
        "{}",
        evidence[0].text
    );

    // Re-running proposes nothing new (stable ids) and attaches fresh evidence only.
    let again = invoke_capability(
        &mut p.kernel,
        &p.host,
        "issue-fix/issue-fix",
        "g1",
        None,
        String::new(),
        false,
    )
    .unwrap();
    assert_eq!(p.kernel.todos("g1").unwrap().len(), todos.len());
    assert_eq!(again.admission.refused, 0);
}

#[test]
fn issue_fix_with_a_green_suite_proposes_no_change() {
    let mut p = with_issue_fix("test a ... ok\ntest b ... ok\n");
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        "issue-fix/issue-fix",
        "g1",
        None,
        String::new(),
        false,
    )
    .unwrap();
    assert_eq!(out.proposals.len(), 1);
    assert_eq!(out.proposals[0].kind(), "no_change");
    assert!(p.kernel.todos("g1").unwrap().is_empty());
}

/// Invokes the hostile capability as agent `me` and returns how many proposals were accepted.
fn accepted(p: &mut Sandbox, payload: &str) -> usize {
    let out = invoke_capability(
        &mut p.kernel,
        &p.host,
        "hostile/cap",
        "g1",
        Some("me"),
        payload.into(),
        false,
    )
    .unwrap();
    assert_eq!(out.admission.refused, 0, "{:?}", out.admission.verdicts);
    out.admission.accepted
}

#[test]
fn a_capability_cannot_open_a_gate_that_blocks_other_agents() {
    let mut p = with_hostile();
    expect_refused(&mut p, "gate", "blocks every agent");
    expect_refused(
        &mut p,
        "gate someone-else",
        "only for the agent it acts for",
    );
    // What it may do: stop the agent it acts for, or ask the operator without blocking anyone.
    assert_eq!(accepted(&mut p, "gate me\nuser-action"), 2);
    let todos = p.kernel.todos("g1").unwrap();
    assert!(
        todos
            .iter()
            .all(|t| t.gate_scope != Some(GateScope::Global)),
        "{todos:?}"
    );
}

#[test]
fn a_capability_cannot_attach_evidence_to_a_gate() {
    let mut p = with_hostile();
    let mut gate = NewTodo::task("approve the release");
    gate.id = Some("gate1".into());
    gate.kind = TodoKind::UserGate;
    gate.gate_scope = Some(GateScope::Global);
    p.kernel.add_todo(&Actor::Operator, "g1", gate).unwrap();
    expect_refused(&mut p, "evidence gate1", "gate");
    let (_, evidence) = p.kernel.todo("g1", "gate1").unwrap();
    assert!(evidence.is_empty(), "{evidence:?}");
}

#[test]
fn evidence_artifacts_are_relative_paths_inside_the_project_with_sha256_digests() {
    let mut p = with_hostile();
    todo(&mut p.kernel, "g1", "t1");
    let long = "a".repeat(5000);
    let huge_digest = "f".repeat(8000);
    let upper = "A".repeat(64);
    for payload in [
        "evidence-artifact t1 /etc/passwd".to_string(),
        "evidence-artifact t1 \\\\server\\share".to_string(),
        "evidence-artifact t1 C:\\Windows".to_string(),
        "evidence-artifact t1 ../outside.txt".to_string(),
        "evidence-artifact t1 out/../../outside.txt".to_string(),
        "evidence-artifact t1 \\0lead".to_string(),
        "evidence-artifact t1 hidden\\e[2Jtext".to_string(),
        "evidence-artifact t1 tab\\tname".to_string(),
        "evidence-artifact t1 txt.\u{202E}exe.md".to_string(),
        format!("evidence-artifact t1 {long}"),
        "evidence-artifact t1 out/report.md abc".to_string(),
        format!("evidence-artifact t1 out/report.md {huge_digest}"),
        format!("evidence-artifact t1 out/report.md {upper}"),
    ] {
        expect_refused(&mut p, &payload, "artifact_");
    }
    let digest = "0123456789abcdef".repeat(4);
    assert_eq!(
        accepted(
            &mut p,
            &format!(
                "evidence-artifact t1 out/report.md {digest}\nevidence-artifact t1 notes/a..b.md"
            )
        ),
        2
    );
    let (_, evidence) = p.kernel.todo("g1", "t1").unwrap();
    assert!(
        evidence
            .iter()
            .any(|e| e.artifact_digest.as_deref() == Some(digest.as_str())),
        "{evidence:?}"
    );
}

#[test]
fn a_capability_binds_new_todos_only_to_installed_capabilities() {
    // A todo bound to a capability that is not there routes the whole goal to repair: binding
    // one is the operator's decision, never a proposal's.
    let mut p = with_hostile();
    expect_refused(&mut p, "add trap1 ghost/ghost", "not installed");
    assert_eq!(accepted(&mut p, "add own1 hostile/cap\nadd plain1"), 2);
    let d = p.kernel.should_run("g1", "me").unwrap();
    assert!(
        d.missing_capabilities.is_empty(),
        "{:?}",
        d.missing_capabilities
    );
}

/// `capability invoke` of a capability that sleeps before it proposes, with an operator command
/// run while it sleeps: what it proposes afterwards must not be admitted.
fn invoke_while_operator_runs(operator: &[&str]) -> serde_json::Value {
    let p = with_hostile();
    let input = p.dir.path().join("payload.txt");
    std::fs::write(&input, "sleep 1500\nadd late1\n").unwrap();
    let cli = |args: &[&str]| {
        let mut cmd = std::process::Command::new(crate::support::loopx_bin());
        cmd.args(args).current_dir(p.dir.path());
        cmd
    };
    let call = cli(&[
        "--format",
        "json",
        "capability",
        "invoke",
        "hostile/cap",
        "--goal-id",
        "g1",
        "--input",
        input.to_str().unwrap(),
    ])
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let op = cli(operator).output().unwrap();
    assert!(op.status.success(), "{operator:?}: {op:?}");
    let out = call.wait_with_output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        p.kernel.todo("g1", "late1").is_err(),
        "{operator:?}: the proposal was admitted: {v}"
    );
    v
}

#[test]
fn nothing_is_admitted_from_a_capability_disabled_or_removed_while_it_ran() {
    for operator in [
        &["extension", "disable", "hostile"][..],
        &["extension", "remove", "hostile"][..],
    ] {
        let v = invoke_while_operator_runs(operator);
        let text = v.to_string();
        assert!(text.contains("no longer installed and enabled"), "{text}");
    }
}
