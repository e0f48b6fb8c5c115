//! A deliberately hostile capability for the sandbox test suite.
//!
//! Its payload is a list of commands, one per line; each either misbehaves (to prove a sandbox
//! limit holds) or emits one transition (to prove kernel admission refuses what it must).

// The generated export glue for `propose` takes one argument per flattened field.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({ world: "capability", path: "../../../wit" });

use loopx::plugin::host::{call_provider, log};
use loopx::plugin::types::{
    AddTodo, AttachEvidence, CompleteTodo, LogLevel, ObserveRequest, OpenUserGate, Priority,
    TodoKind, TodoReason,
};

struct HostileCap;

#[allow(unconditional_recursion)]
fn recurse(depth: u64, acc: &mut [u64; 64]) -> u64 {
    acc[(depth % 64) as usize] = depth;
    let next = std::hint::black_box(depth + 1);
    recurse(next, acc) + acc[0]
}

impl Guest for HostileCap {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "hostile-cap".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "misbehaves on purpose".into(),
            operations: vec![],
        }
    }

    fn propose(input: ProposeInput) -> Result<Vec<Transition>, PluginError> {
        let mut out = Vec::new();
        for line in input.payload.lines() {
            let (cmd, arg) = line.split_once(' ').unwrap_or((line, ""));
            match cmd {
                "" => {}
                "ok" => out.push(Transition::NoChange("nothing to do".into())),
                "count" => {
                    // State that would survive if the host reused an instance or its memory.
                    static CALLS: std::sync::atomic::AtomicU32 =
                        std::sync::atomic::AtomicU32::new(0);
                    let n = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    out.push(Transition::NoChange(format!("call {n}")));
                }
                "loop" => {
                    let mut n: u64 = 0;
                    loop {
                        n = std::hint::black_box(n.wrapping_add(1));
                    }
                }
                "sleep" => {
                    // Blocks inside a WASI host call, where no epoch check can stop it.
                    let ms: u64 = arg.parse().unwrap_or(60_000);
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                    out.push(Transition::NoChange(format!("slept {ms} ms")));
                }
                "grow" => {
                    let mut keep: Vec<Vec<u8>> = Vec::new();
                    loop {
                        keep.push(vec![7u8; 1 << 20]);
                        std::hint::black_box(&keep);
                    }
                }
                "recurse" => {
                    let mut acc = [0u64; 64];
                    let r = recurse(0, &mut acc);
                    out.push(Transition::NoChange(format!("{r}")));
                }
                "big-list" => {
                    let n: usize = arg.parse().unwrap_or(5000);
                    for i in 0..n {
                        out.push(Transition::NoChange(format!("{i}")));
                    }
                }
                "big-string" => {
                    let n: usize = arg.parse().unwrap_or(64 * 1024);
                    out.push(Transition::NoChange("x".repeat(n)));
                }
                "panic" => panic!("hostile-cap was told to panic"),
                "log" => {
                    for i in 0..arg.parse::<usize>().unwrap_or(10) {
                        log(LogLevel::Info, &format!("\x1b[31mline {i}\x1b[0m"));
                        eprintln!("stderr line {i}");
                    }
                }
                "call" => {
                    let mut parts = arg.splitn(3, ' ');
                    let provider = parts.next().unwrap_or_default();
                    let op = parts.next().unwrap_or("read");
                    let target = parts.next().unwrap_or("");
                    let request = ObserveRequest {
                        operation: op.into(),
                        target: target.into(),
                        params: vec![],
                    };
                    match call_provider(provider, &request) {
                        Ok(obs) => {
                            out.push(Transition::NoChange(format!("observed: {}", obs.summary)))
                        }
                        Err(e) => return Err(e),
                    }
                }
                "complete" => out.push(Transition::CompleteTodo(CompleteTodo {
                    todo_id: arg.into(),
                    evidence: None,
                })),
                "block" => out.push(Transition::BlockTodo(TodoReason {
                    todo_id: arg.into(),
                    reason: "hostile".into(),
                })),
                "evidence" => out.push(Transition::AttachEvidence(AttachEvidence {
                    todo_id: arg.into(),
                    text: "hostile evidence".into(),
                    artifact_path: None,
                    artifact_digest: None,
                })),
                "evidence-artifact" => {
                    // `evidence-artifact TODO PATH [DIGEST]`: `\0`, `\e` and `\t` in PATH stand for
                    // NUL, ESC and TAB, so a line can carry them.
                    let mut parts = arg.splitn(3, ' ');
                    let todo_id = parts.next().unwrap_or_default();
                    let path = parts
                        .next()
                        .unwrap_or_default()
                        .replace("\\0", "\0")
                        .replace("\\e", "\x1b")
                        .replace("\\t", "\t");
                    out.push(Transition::AttachEvidence(AttachEvidence {
                        todo_id: todo_id.into(),
                        text: "hostile evidence".into(),
                        artifact_path: Some(path),
                        artifact_digest: parts.next().map(str::to_string),
                    }))
                }
                "gate" => out.push(Transition::OpenUserGate(OpenUserGate {
                    title: "hostile gate".into(),
                    detail: String::new(),
                    blocking: true,
                    blocks_agent: (!arg.is_empty()).then(|| arg.to_string()),
                })),
                "user-action" => out.push(Transition::OpenUserGate(OpenUserGate {
                    title: "hostile question".into(),
                    detail: String::new(),
                    blocking: false,
                    blocks_agent: None,
                })),
                "add" => {
                    // `add ID [CAPABILITY]`: a task, bound to CAPABILITY when given.
                    let (id, capability) = arg.split_once(' ').unwrap_or((arg, ""));
                    out.push(Transition::AddTodo(AddTodo {
                        id: Some(id.into()),
                        title: format!("added by hostile-cap: {id}"),
                        detail: String::new(),
                        priority: Priority::P0,
                        kind: TodoKind::Task,
                        lane: None,
                        depends_on: vec![],
                        capability: (!capability.is_empty()).then(|| capability.to_string()),
                    }))
                }
                "error" => return Err(PluginError::InvalidInput(arg.into())),
                other => {
                    return Err(PluginError::InvalidInput(format!(
                        "unknown command {other}"
                    )));
                }
            }
        }
        Ok(out)
    }
}

export!(HostileCap);
