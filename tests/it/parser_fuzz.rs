//! Fuzzing on the stable toolchain: property tests of the three parsers that take input LoopX does
//! not control — a host's turn result, an extension manifest, and a proposal (`Transition`).
//!
//! For each: arbitrary text and mutations of valid documents never panic, and whatever is accepted
//! re-serializes to a document that is accepted again as the same value (round trip), within the
//! depth and size limits, and readable back through serde_json after the journal embeds it.
//!
//! `cargo test --test it parser_fuzz::` runs 256 cases per property (proptest's default). A longer
//! run: `PROPTEST_CASES=100000 cargo test --release --test it parser_fuzz::`. A failure prints the
//! minimal input and proptest stores its seed in `tests/proptest-regressions/parser_fuzz.txt`, so
//! the case is replayed first on every later run (commit that file). Proptest derives that path
//! from this file's: beside the test binary's root (`tests/it`, found by its `main.rs`), in
//! `proptest-regressions/`, named after this file.

use proptest::prelude::*;
use serde_json::{Value, json};

use loopx::kernel::admission::check_proposal;
use loopx::kernel::transition::Transition;
use loopx::plugin::Manifest;
use loopx::plugin::manifest::MAX_MANIFEST_BYTES;
use loopx::turn::result::{MAX_RESULT_DEPTH, MAX_STDOUT, json_depth_over, parse_result_text};

const KEY: &str = "turn-01FUZZ";

const RESULTS: &[&str] = &[
    r#"{"schema_version":"loopx.turn_result.v1","status":"completed","summary":"done","evidence":[{"text":"cargo test passed","artifact_path":"out/log.txt"}]}"#,
    r#"{"schema_version":"loopx.turn_result.v1","turn_key":"turn-01FUZZ","status":"progress","observations":[{"kind":"k","data":{"a":[1,2.5,{"b":null}],"c":"\u00e9\n"}}]}"#,
    r#"{"schema_version":"loopx.turn_result.v1","status":"wait","proposals":[{"type":"add_todo","id":"t9","title":"x","detail":"","priority":"P2","kind":"task","lane":null,"depends_on":["t1"],"capability":null},{"type":"attach_evidence","todo_id":"t1","text":"e","artifact_path":null,"artifact_digest":null}]}"#,
    r#"{"schema_version":"loopx.turn_result.v1","status":"user_action_required","summary":"","proposals":[{"type":"open_user_gate","title":"t","detail":"d","blocking":true,"blocks_agent":"a1"},{"type":"schedule_wake","after_seconds":60,"reason":"r"}]}"#,
];

const MANIFESTS: &[&str] = &[
    "id = \"fs-observe\"\nversion = \"0.1.0\"\napi = \">=0.1, <0.2\"\ndescription = \"d\"\npermissions = [\"fs.read:repo\", \"env:HOME\"]\n\n[[provides]]\nkind = \"provider\"\nid = \"fs\"\ncomponent = \"fs.wasm\"\n[provides.limits]\nfuel = 1000\ndeadline_ms = 500\n",
    "id = \"issue-fix\"\nversion = \"1.2.3-beta.1+build\"\napi = \"^0.1\"\n\n[[provides]]\nkind = \"capability\"\nid = \"issue-fix\"\ncomponent = \"/abs/c.wasm\"\nuses = [\"fs-observe/fs\"]\nlimits = { max_provider_calls = 4, memory_mib = 32 }\n",
];

const TRANSITIONS: &[&str] = &[
    r#"{"type":"add_todo","id":null,"title":"t","detail":"","priority":"P0","kind":"monitor","lane":"l","depends_on":[],"capability":"a/b"}"#,
    r#"{"type":"attach_evidence","todo_id":"t1","text":"x","artifact_path":"a/b.txt","artifact_digest":"00"}"#,
    r#"{"type":"complete_todo","todo_id":"t1","evidence":"ok"}"#,
    r#"{"type":"block_todo","todo_id":"t1","reason":"r"}"#,
    r#"{"type":"request_replan","reason":"r"}"#,
    r#"{"type":"schedule_wake","after_seconds":18446744073709551615,"reason":"r"}"#,
    r#"{"type":"no_change","reason":"\u0000"}"#,
];

/// A mutation of `seed`: each edit replaces, inserts or deletes one byte at a position taken
/// modulo the current length; the bytes are decoded lossily, so the result is always a `&str`.
fn mutated(seeds: &'static [&'static str]) -> impl Strategy<Value = String> {
    (
        0..seeds.len(),
        prop::collection::vec((any::<u16>(), 0u8..3, any::<u8>()), 1..8),
    )
        .prop_map(move |(i, edits)| {
            let mut bytes = seeds[i].as_bytes().to_vec();
            for (pos, op, byte) in edits {
                let at = pos as usize % (bytes.len() + 1);
                // Bias towards JSON/TOML punctuation: random bytes rarely make a new structure.
                let b = match byte % 4 {
                    0 => b"{}[]\",:=\\ 0\n#"[byte as usize % 14],
                    _ => byte,
                };
                match op {
                    0 if at < bytes.len() => bytes[at] = b,
                    1 => bytes.insert(at, b),
                    _ if at < bytes.len() => {
                        bytes.remove(at);
                    }
                    _ => bytes.push(b),
                }
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
}

/// Arbitrary JSON values, nested up to about `depth` levels.
fn json_value(depth: u32) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(depth, 256, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A result whose one observation carries `data`, and a chain of `extra` arrays around it.
fn result_with(data: Value, extra: usize) -> String {
    let data = format!(
        "{}{}{}",
        "[".repeat(extra),
        serde_json::to_string(&data).unwrap(),
        "]".repeat(extra)
    );
    format!(
        r#"{{"schema_version":"loopx.turn_result.v1","status":"progress","observations":[{{"kind":"k","data":{data}}}]}}"#
    )
}

/// The properties every accepted result keeps.
fn check_result_text(text: &str) -> Result<(), TestCaseError> {
    let Ok(r) = parse_result_text(text, KEY) else {
        return Ok(());
    };
    let again = serde_json::to_string(&r).unwrap();
    prop_assert!(json_depth_over(&again, MAX_RESULT_DEPTH).is_none());
    // The journal embeds the result one level down; the reader must get it back.
    let row = serde_json::to_string(&json!({"data": {"result": &r}})).unwrap();
    prop_assert!(
        serde_json::from_str::<Value>(&row).is_ok(),
        "journal row unreadable"
    );
    if again.len() <= MAX_STDOUT {
        let reparsed = parse_result_text(&again, KEY);
        prop_assert_eq!(
            reparsed.as_ref().ok(),
            Some(&r),
            "{:?}",
            reparsed.as_ref().err()
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn turn_result_arbitrary_text(text in any::<String>()) {
        check_result_text(&text)?;
    }

    #[test]
    fn turn_result_mutations(text in mutated(RESULTS)) {
        check_result_text(&text)?;
    }

    #[test]
    fn turn_result_arbitrary_data(data in json_value(8), extra in 0usize..140) {
        let text = result_with(data, extra);
        check_result_text(&text)?;
        // Anything deeper than the limit is refused by the parser, never by the reader later.
        if json_depth_over(&text, MAX_RESULT_DEPTH).is_some() {
            prop_assert!(parse_result_text(&text, KEY).is_err());
        }
    }

    #[test]
    fn manifest_arbitrary_and_mutated(text in prop_oneof![any::<String>(), mutated(MANIFESTS)]) {
        if let Ok(m) = Manifest::parse(&text, "fuzz") {
            prop_assert!(text.len() as u64 <= MAX_MANIFEST_BYTES);
            let again = toml::to_string(&m).unwrap();
            let reparsed = Manifest::parse(&again, "fuzz");
            prop_assert_eq!(reparsed.as_ref().ok(), Some(&m), "{:?}\n{}", reparsed.as_ref().err(), again);
        }
    }

    #[test]
    fn transition_arbitrary_and_mutated(text in prop_oneof![any::<String>(), mutated(TRANSITIONS)]) {
        if let Ok(t) = serde_json::from_str::<Transition>(&text) {
            let _ = check_proposal(&t);
            let again = serde_json::to_string(&t).unwrap();
            let reparsed = serde_json::from_str::<Transition>(&again);
            prop_assert_eq!(reparsed.as_ref().ok(), Some(&t), "{:?}", reparsed.as_ref().err());
        }
    }
}

#[test]
fn the_seeds_are_valid() {
    for r in RESULTS {
        parse_result_text(r, KEY).unwrap_or_else(|e| panic!("{r}: {e}"));
    }
    for m in MANIFESTS {
        Manifest::parse(m, "seed").unwrap_or_else(|e| panic!("{m}: {e}"));
    }
    for t in TRANSITIONS {
        serde_json::from_str::<Transition>(t).unwrap_or_else(|e| panic!("{t}: {e}"));
    }
}
