//! Durable writeback: the host's result goes through the todo's capability and kernel admission.
//! The built-in default maps statuses and explicit proposals; a refused proposal is recorded but
//! does not fail the turn unless every proposal was refused; a WebAssembly capability is called
//! through the plugin host, and its failure is `writeback_failed` with nothing admitted.

use crate::support::{Project, plugin, turn_run};
use loopx::kernel::Actor;
use loopx::kernel::todo::NewTodo;
use serde_json::Value;

fn host_printing(p: &Project, result: &str) -> String {
    p.script(
        "host.sh",
        &format!("cat >/dev/null\ncat <<'JSON'\n{result}\nJSON\n"),
    )
}

fn turn(p: &Project, host: &str) -> Value {
    p.json(&turn_run("a1", &[], &[host]))["turn"].clone()
}

#[test]
fn explicit_proposals_are_admitted_and_refusals_recorded() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    p.ok(&Project::todo_args("claim", "g", "t2", "a2", &[]));
    let host = host_printing(
        &p,
        r#"{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"split the work",
            "evidence":[{"text":"looked at it","artifact_path":"notes.md"}],
            "proposals":[
              {"type":"add_todo","id":"t9","title":"follow-up found during t1","detail":"","priority":"P1","kind":"task","lane":null,"depends_on":["t1"],"capability":null},
              {"type":"complete_todo","todo_id":"t2","evidence":"not mine"}
            ]}"#,
    );
    let t = turn(&p, &host);
    assert_eq!(t["kind"], "validated_progress", "{t}");
    assert_eq!(t["spent"], true);
    let j = p.journal(t["turn_key"].as_str().unwrap());
    let verdicts = j["data"]["writeback"]["verdicts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(verdicts.len(), 3, "{verdicts:?}");
    assert_eq!(verdicts[0]["transition"], "attach_evidence");
    assert_eq!(verdicts[0]["accepted"], true);
    assert_eq!(verdicts[1]["transition"], "add_todo");
    assert_eq!(verdicts[1]["accepted"], true);
    assert_eq!(verdicts[2]["transition"], "complete_todo");
    assert_eq!(verdicts[2]["accepted"], false, "t2 is leased to a2");
    assert_eq!(
        p.todo("t9")["todo"]["depends_on"],
        serde_json::json!(["t1"])
    );
    assert_eq!(p.todo_status("t2"), "claimed");
    let ev = p.todo("t1")["evidence"].as_array().unwrap().clone();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0]["artifact_path"], "notes.md");
    // The run row carries every verdict.
    let runs = p.history();
    assert_eq!(runs[0]["payload"]["writeback"]["refused"], 1);
}

#[test]
fn every_proposal_refused_is_writeback_failed() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    p.add_work("t2");
    p.ok(&Project::todo_args("claim", "g", "t2", "a2", &[]));
    let host = host_printing(
        &p,
        r#"{"schema_version":"loopx.turn_result.v1","status":"progress",
            "proposals":[{"type":"block_todo","todo_id":"t2","reason":"sabotage"}]}"#,
    );
    let t = turn(&p, &host);
    assert_eq!(t["kind"], "writeback_failed", "{t}");
    assert_eq!(t["failed_phase"], "durable_writeback");
    assert_eq!(t["spent"], false);
    assert_eq!(t["lease"], "released");
    assert!(p.spends().is_empty());
    assert_eq!(p.todo_status("t1"), "open");
    assert_eq!(p.todo_status("t2"), "claimed");
    assert_eq!(p.history().len(), 1);
}

#[test]
fn repair_and_replan_claims_map_to_kernel_transitions() {
    let p = Project::with_goal_g();
    p.add_work("t1");
    let host = host_printing(
        &p,
        r#"{"schema_version":"loopx.turn_result.v1","status":"repair_required","summary":"the build toolchain is missing"}"#,
    );
    let t = turn(&p, &host);
    assert_eq!(t["kind"], "repair_required");
    assert_eq!(t["status"], "committed");
    assert_eq!(t["spent"], true);
    assert_eq!(t["lease"], "cleared");
    let t1 = p.todo("t1");
    assert_eq!(t1["todo"]["status"], "blocked");
    assert_eq!(
        t1["todo"]["status_reason"],
        "the build toolchain is missing"
    );

    p.add_work("t2");
    let host = host_printing(
        &p,
        r#"{"schema_version":"loopx.turn_result.v1","status":"replan_required","summary":"the approach is wrong"}"#,
    );
    let t = turn(&p, &host);
    assert_eq!(t["kind"], "replan_required");
    assert_eq!(t["lease"], "released");
    let j = p.journal(t["turn_key"].as_str().unwrap());
    assert_eq!(
        j["data"]["writeback"]["verdicts"][0]["transition"],
        "request_replan"
    );

    p.add_work("t3");
    let host = host_printing(
        &p,
        r#"{"schema_version":"loopx.turn_result.v1","status":"wait","summary":"CI is still running"}"#,
    );
    let t = turn(&p, &host);
    assert_eq!(t["kind"], "wait");
    assert_eq!(t["status"], "stopped");
    assert_eq!(t["spent"], false);
    let phases = t["phases"].as_array().unwrap();
    assert!(!phases.iter().any(|x| x == "quota_spend"), "{phases:?}");
    assert_eq!(p.spends().len(), 2);
}

/// A todo bound to a WebAssembly capability: the driver loads it through the plugin host and calls
/// `propose` with the turn payload. The hostile test capability refuses that payload, so the turn
/// is `writeback_failed`: nothing admitted, nothing spent, the lease released.
#[test]
fn wasm_capability_failure_is_writeback_failed() {
    let mut pp = plugin::Sandbox::new();
    pp.goal("g");
    let dir = plugin::extension(
        pp.dir.path(),
        "hostile",
        "capability",
        "cap",
        &plugin::wasm("hostile-cap"),
        &[],
        "",
        "",
    );
    pp.install(&dir, &[]).unwrap();
    let mut t = NewTodo::task("bound to a wasm capability");
    t.id = Some("t1".into());
    t.capability = Some("hostile/cap".into());
    pp.kernel.add_todo(&Actor::Operator, "g", t).unwrap();
    // Drive it through the CLI, on the same project.
    let host = pp.script(
        "host.sh",
        "cat >/dev/null\nprintf '{\"schema_version\":\"loopx.turn_result.v1\",\"status\":\"progress\",\"evidence\":[{\"text\":\"x\"}]}'\n",
    );
    let v = pp.json(&turn_run("a1", &[], &[&host]));
    let t = &v["turn"];
    assert_eq!(t["kind"], "writeback_failed", "{t}");
    let detail = t["detail"].as_str().unwrap();
    assert!(
        detail.contains("hostile/cap") && detail.contains("unknown command"),
        "{detail}"
    );
    // The failure's kind is a field of the outcome and of the journal, not only prose.
    assert_eq!(t["plugin_failure"], "guest_error", "{t}");
    let key = t["turn_key"].as_str().unwrap();
    let inspected = pp.json(&["turn", "inspect", "--turn-key", key]).to_string();
    assert!(
        inspected.contains(r#""plugin_failure":"guest_error""#),
        "{inspected}"
    );
    // A sandbox limit: the payload makes the capability loop until its fuel runs out.
    let looping = pp.script(
        "looping.sh",
        "cat >/dev/null\nprintf '{\"schema_version\":\"loopx.turn_result.v1\",\"status\":\"progress\",\"observations\":[{\"kind\":\"capability_payload\",\"data\":\"loop\"}]}'\n",
    );
    let v = pp.json(&turn_run("a1", &[], &[&looping]));
    assert_eq!(v["turn"]["kind"], "writeback_failed", "{v}");
    assert_eq!(v["turn"]["plugin_failure"], "fuel_exhausted", "{v}");
    let (todo, evidence) = pp.kernel.todo("g", "t1").unwrap();
    assert_eq!(todo.status.as_str(), "open");
    assert!(todo.claim.is_none());
    assert!(evidence.is_empty(), "nothing admitted");
    let q = pp.kernel.quota("g", None).unwrap().view;
    assert_eq!(q.spent_slots, 0);
}

/// The first-party issue-fix capability (WebAssembly, calling the fs-observe provider) driven by a
/// turn: the host hands it its own payload format through a `capability_payload` observation, and
/// the proposals it makes are admitted in the turn's writeback.
#[test]
fn wasm_capability_proposals_are_admitted_in_writeback() {
    let mut pp = plugin::Sandbox::new();
    pp.goal("g");
    let ws = pp.dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::write(
        ws.join("test-results.txt"),
        "test parser::empty_input ... FAILED\ntest parser::nested ... ok\n",
    )
    .unwrap();
    plugin::wasm("fs-observe");
    plugin::wasm("issue-fix");
    let grant = format!("fs.read:workspace={}", ws.display());
    pp.install(&plugin::repo().join("extensions/fs-observe"), &[&grant])
        .unwrap();
    pp.install(&plugin::repo().join("extensions/issue-fix"), &[])
        .unwrap();
    let mut t = NewTodo::task("triage the failing tests");
    t.id = Some("triage".into());
    t.capability = Some("issue-fix/issue-fix".into());
    pp.kernel.add_todo(&Actor::Operator, "g", t).unwrap();

    let host = pp.script(
        "host.sh",
        r#"cat >/dev/null
printf '%s' '{"schema_version":"loopx.turn_result.v1","status":"progress","summary":"ran the suite",
  "observations":[{"kind":"capability_payload","data":"issue = Parser crashes on empty input\nresults = test-results.txt"}]}'
"#,
    );
    let v = pp.json(&turn_run("a1", &[], &[&host]));
    let turn = &v["turn"];
    assert_eq!(turn["kind"], "validated_progress", "{turn}");
    assert_eq!(turn["spent"], true);
    let todos = pp.kernel.todos("g").unwrap();
    let lanes: Vec<&str> = todos.iter().filter_map(|t| t.lane.as_deref()).collect();
    for lane in ["feasibility", "patch", "checks", "review"] {
        assert!(lanes.contains(&lane), "no {lane} todo in {lanes:?}");
    }
    let rec = loopx::turn::inspect(&mut pp.kernel, turn["turn_key"].as_str().unwrap()).unwrap();
    let wb = &rec.data["writeback"];
    assert_eq!(wb["capability"], "issue-fix/issue-fix");
    assert_eq!(wb["refused"], 0, "{wb}");
    assert!(wb["accepted"].as_u64().unwrap() >= 4);
    assert_eq!(wb["call"]["provider_calls"][0]["outcome"], "ok");
    let (triage, _) = pp.kernel.todo("g", "triage").unwrap();
    assert!(triage.claim.is_none(), "lease released");
}
