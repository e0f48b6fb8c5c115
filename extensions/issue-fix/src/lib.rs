//! `issue-fix`: a LoopX capability that turns observations about a repository's test state into a
//! chain of todos across the lanes feasibility → patch → checks → review, with evidence attached.
//!
//! Payload (`--input FILE`), one `key = value` per line, all optional:
//!
//! ```text
//! issue    = Parser crashes on empty input     # what is being fixed (default: "failing tests")
//! provider = fs-observe/fs                     # provider to ask (must be in `uses`)
//! results  = test-results.txt                  # test output, relative to the provider's grant
//! root     = workspace                         # which granted directory (fs-observe `root` param)
//! ```
//!
//! Behaviour: asks the provider for `test-results`; with failing tests it proposes (once, ids are
//! stable) a feasibility todo, one patch todo per failing test (depending on feasibility, at most
//! 50), a checks todo depending on every patch, and a review todo depending on checks, then attaches
//! the observation as evidence to the feasibility todo (or, when patches already exist, to the
//! checks todo). With no failing tests it attaches "suite green" evidence to an open checks todo, or
//! proposes no change. It never completes anything: passing checks is evidence, not a verdict.

// The generated export glue for `propose` takes one argument per flattened field.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({ world: "capability", path: "../../wit" });

use loopx::plugin::host::{call_provider, log};
use loopx::plugin::types::{
    AddTodo, AttachEvidence, Fact, LogLevel, Observation, ObserveRequest, Priority, TodoKind,
    TodoStatus,
};

const MAX_PATCHES: usize = 50;
const MAX_ID: usize = 80; // the kernel's MAX_ID_LEN

struct IssueFix;

struct Config {
    issue: String,
    provider: String,
    results: String,
    root: Option<String>,
}

fn parse_payload(payload: &str) -> Result<Config, PluginError> {
    let mut c = Config {
        issue: "failing tests".into(),
        provider: "fs-observe/fs".into(),
        results: "test-results.txt".into(),
        root: None,
    };
    for (n, line) in payload.lines().enumerate() {
        let line = line.split(" #").next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line.split_once('=').ok_or_else(|| {
            PluginError::InvalidInput(format!("line {}: expected key = value", n + 1))
        })?;
        let v = v.trim().trim_matches('"').to_string();
        match k.trim() {
            "issue" => c.issue = v,
            "provider" => c.provider = v,
            "results" => c.results = v,
            "root" => c.root = Some(v),
            other => {
                return Err(PluginError::InvalidInput(format!(
                    "line {}: unknown key '{other}' (expected issue, provider, results, root)",
                    n + 1
                )));
            }
        }
    }
    Ok(c)
}

/// A path-safe id fragment: lowercase alphanumerics and '-', plus a short hash so distinct names
/// never collide after slugging.
fn slug(text: &str, max: usize) -> String {
    let mut s: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while s.contains("--") {
        s = s.replace("--", "-");
    }
    let s = s.trim_matches('-');
    let mut hash: u32 = 0x811c9dc5;
    for b in text.bytes() {
        hash = (hash ^ b as u32).wrapping_mul(0x01000193);
    }
    let head: String = s.chars().take(max).collect();
    format!("{}-{:06x}", head.trim_matches('-'), hash & 0xff_ffff)
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn evidence_text(obs: &Observation) -> String {
    clip(
        &format!("{} [{}]\n{}", obs.summary, obs.source, obs.body),
        6000,
    )
}

impl Guest for IssueFix {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "issue-fix".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description:
                "failing tests → feasibility, patch, checks and review todos with evidence".into(),
            operations: vec![],
        }
    }

    fn propose(input: ProposeInput) -> Result<Vec<Transition>, PluginError> {
        let cfg = parse_payload(&input.payload)?;
        let goal = &input.goal;
        let mut params = Vec::new();
        if let Some(root) = &cfg.root {
            params.push(Fact {
                key: "root".into(),
                value: root.clone(),
            });
        }
        let obs = call_provider(
            &cfg.provider,
            &ObserveRequest {
                operation: "test-results".into(),
                target: cfg.results.clone(),
                params,
            },
        )?;
        let failing: Vec<&str> = obs
            .facts
            .iter()
            .filter(|f| f.key == "failing-test")
            .map(|f| f.value.as_str())
            .collect();
        log(
            LogLevel::Info,
            &format!("{} failing tests observed", failing.len()),
        );

        let base: String = goal.goal_id.chars().take(30).collect();
        let feas_id = format!("{base}-feasibility");
        let checks_id = format!("{base}-checks");
        let review_id = format!("{base}-review");
        let exists = |id: &str| goal.todos.iter().find(|t| t.id == id);
        let open = |id: &str| {
            exists(id)
                .is_some_and(|t| !matches!(t.status, TodoStatus::Completed | TodoStatus::Archived))
        };
        let mut out = Vec::new();

        if failing.is_empty() {
            if open(&checks_id) {
                out.push(Transition::AttachEvidence(AttachEvidence {
                    todo_id: checks_id,
                    text: format!("suite green: {}", evidence_text(&obs)),
                    artifact_path: Some(cfg.results.clone()),
                    artifact_digest: None,
                }));
            } else {
                out.push(Transition::NoChange(format!(
                    "no failing tests in {}",
                    cfg.results
                )));
            }
            return Ok(out);
        }

        let task =
            |id: &str, title: String, detail: String, lane: &str, depends_on: Vec<String>| {
                Transition::AddTodo(AddTodo {
                    id: Some(id.to_string()),
                    title: clip(&title, 400),
                    detail: clip(&detail, 4000),
                    priority: Priority::P1,
                    kind: TodoKind::Task,
                    lane: Some(lane.to_string()),
                    depends_on,
                    capability: None,
                })
            };
        let fresh = exists(&feas_id).is_none();
        if fresh {
            out.push(task(
                &feas_id,
                format!("Reproduce and scope: {}", cfg.issue),
                format!(
                    "{} failing test(s) in {}: {}. Confirm they fail for the reason in the issue and that a fix is feasible.",
                    failing.len(),
                    cfg.results,
                    failing.iter().take(10).cloned().collect::<Vec<_>>().join(", ")
                ),
                "feasibility",
                vec![],
            ));
        }
        let mut patch_ids = Vec::new();
        for name in failing.iter().take(MAX_PATCHES) {
            let id: String = format!("{base}-patch-{}", slug(name, 30))
                .chars()
                .take(MAX_ID)
                .collect();
            if exists(&id).is_none() {
                out.push(task(
                    &id,
                    format!("Fix failing test {name}"),
                    format!(
                        "`{name}` fails in {}. Patch the code (not the test) until it passes.",
                        cfg.results
                    ),
                    "patch",
                    vec![feas_id.clone()],
                ));
            }
            patch_ids.push(id);
        }
        if exists(&checks_id).is_none() {
            out.push(task(
                &checks_id,
                "Run the full test suite green".into(),
                format!(
                    "Every test in {} passes, including the {} that failed.",
                    cfg.results,
                    failing.len()
                ),
                "checks",
                patch_ids.clone(),
            ));
        }
        if exists(&review_id).is_none() {
            out.push(task(
                &review_id,
                format!("Review the fix for: {}", cfg.issue),
                "Read the diff, confirm each patch addresses the root cause, and that no test was weakened.".into(),
                "review",
                vec![checks_id.clone()],
            ));
        }
        let evidence_target = if fresh || open(&feas_id) {
            feas_id
        } else {
            checks_id
        };
        out.push(Transition::AttachEvidence(AttachEvidence {
            todo_id: evidence_target,
            text: evidence_text(&obs),
            artifact_path: Some(cfg.results.clone()),
            artifact_digest: None,
        }));
        Ok(out)
    }
}

export!(IssueFix);
