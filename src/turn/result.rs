//! The host's side of the protocol: the request it reads on stdin and the result it prints on
//! stdout (`loopx.turn_result.v1`), with every limit checked here, in one place.
//!
//! Unknown fields are refused at every level (`deny_unknown_fields`): a host that misspells
//! `evidence` must hear about it, not have its evidence silently dropped.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::host::ProcessOutcome;
use crate::kernel::admission::check_proposal;
use crate::kernel::monitor::MAX_OBSERVATION;
use crate::kernel::transition::Transition;
use crate::model::wire_enum;

pub const REQUEST_SCHEMA: &str = "loopx.turn_request.v1";
pub const RESULT_SCHEMA: &str = "loopx.turn_result.v1";

/// Most stdout bytes read from a host; more is `oversized` (the result is refused).
pub const MAX_STDOUT: usize = 64 * 1024;
/// Stderr tail kept in the journal.
pub const MAX_STDERR_TAIL: usize = 4 * 1024;
pub const MAX_SUMMARY: usize = 2000;
pub const MAX_EVIDENCE_ITEMS: usize = 32;
pub const MAX_OBSERVATIONS: usize = 64;
/// Largest serialized `data` of one observation.
pub const MAX_OBSERVATION_BYTES: usize = 16 * 1024;
pub const MAX_HOST_PROPOSALS: usize = 64;
/// Deepest nesting of arrays and objects in a result, counting the result object as 1.
/// serde_json's reader refuses documents nested deeper than 128, and the journal row and the run
/// row embed the result one level down (`data.result`, `payload.result`); refusing anything deeper
/// than 64 here means whatever is accepted can always be read back, with room to spare.
pub const MAX_RESULT_DEPTH: usize = 64;

wire_enum!(
    /// What the host says its turn achieved.
    HostStatus {
        Progress => "progress",
        Completed => "completed",
        RepairRequired => "repair_required",
        ReplanRequired => "replan_required",
        UserActionRequired => "user_action_required",
        Wait => "wait",
    }
);

/// One piece of evidence: what was done and how it was checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvidenceItem {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_path: Option<String>,
}

/// A structured observation handed to the todo's capability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservationItem {
    pub kind: String,
    #[serde(default)]
    pub data: Value,
}

/// The result a host prints on stdout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostResult {
    pub schema_version: String,
    /// Optional echo of the request's turn key; when present it must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_key: Option<String>,
    pub status: HostStatus,
    #[serde(default)]
    pub summary: String,
    #[serde(default)]
    pub evidence: Vec<EvidenceItem>,
    #[serde(default)]
    pub observations: Vec<ObservationItem>,
    /// Explicit kernel transitions; honoured only by the built-in default capability.
    #[serde(default)]
    pub proposals: Vec<Transition>,
    /// On a turn that works a scheduled monitor: what the check observed, recorded as the
    /// monitor's check in the transaction that settles the turn's writeback (compared by digest
    /// with the last check). Ignored on other todos.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitor_observation: Option<String>,
}

/// Parses and checks a host's stdout. The error is a sentence naming the problem.
pub fn parse_result(out: &ProcessOutcome, turn_key: &str) -> Result<HostResult, String> {
    if out.stdout_oversized {
        return Err(format!(
            "stdout is {} bytes; the limit is {MAX_STDOUT}",
            out.stdout_bytes
        ));
    }
    if !out.stdout_utf8 {
        return Err("stdout is not valid UTF-8".to_string());
    }
    parse_result_text(&out.stdout, turn_key)
}

/// Parses and checks a result document (the host's stdout, already known to be UTF-8): size and
/// depth first, so nothing larger or deeper than the limits reaches the JSON reader, then shape
/// and every field limit.
pub fn parse_result_text(stdout: &str, turn_key: &str) -> Result<HostResult, String> {
    if stdout.len() > MAX_STDOUT {
        return Err(format!(
            "stdout is {} bytes; the limit is {MAX_STDOUT}",
            stdout.len()
        ));
    }
    let text = stdout.trim();
    if text.is_empty() {
        return Err(format!(
            "stdout is empty; the host must print one {RESULT_SCHEMA} JSON object"
        ));
    }
    if let Some(depth) = json_depth_over(text, MAX_RESULT_DEPTH) {
        return Err(format!(
            "the result nests arrays and objects {depth} levels deep; the limit is {MAX_RESULT_DEPTH}"
        ));
    }
    let result: HostResult = serde_json::from_str(text).map_err(|e| {
        let head: String = text.chars().take(120).collect();
        format!("stdout is not a {RESULT_SCHEMA} object: {e} (stdout starts: {head:?})")
    })?;
    check_result(&result, turn_key)?;
    Ok(result)
}

/// The nesting depth of the JSON text `text` once it exceeds `limit` (arrays and objects; the
/// outermost counts as 1), or `None` when it stays within. A lexical scan: brackets inside strings
/// do not count, and the scan stops at the first level over the limit, so the cost is bounded by
/// the input and no recursion happens. For text that is not JSON the figure is meaningless, but
/// such text is refused by the parser anyway.
pub fn json_depth_over(text: &str, limit: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > limit {
                    return Some(depth);
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

fn check_result(r: &HostResult, turn_key: &str) -> Result<(), String> {
    if r.schema_version != RESULT_SCHEMA {
        return Err(format!(
            "schema_version is '{}'; expected '{RESULT_SCHEMA}'",
            r.schema_version
        ));
    }
    if let Some(k) = &r.turn_key
        && k != turn_key
    {
        return Err(format!(
            "turn_key '{k}' does not match this turn ('{turn_key}')"
        ));
    }
    if r.summary.len() > MAX_SUMMARY {
        return Err(format!(
            "summary is {} bytes; the limit is {MAX_SUMMARY}",
            r.summary.len()
        ));
    }
    if r.evidence.len() > MAX_EVIDENCE_ITEMS {
        return Err(format!(
            "{} evidence items; the limit is {MAX_EVIDENCE_ITEMS}",
            r.evidence.len()
        ));
    }
    for (i, e) in r.evidence.iter().enumerate() {
        if e.text.trim().is_empty() {
            return Err(format!("evidence[{i}].text is empty"));
        }
        // The same check admission applies to an `attach_evidence` proposal (which is what this
        // item becomes): one validation, whichever way evidence arrives.
        let as_proposal = Transition::AttachEvidence {
            todo_id: String::new(),
            text: e.text.clone(),
            artifact_path: e.artifact_path.clone(),
            artifact_digest: None,
        };
        if let Err(why) = check_proposal(&as_proposal) {
            return Err(format!("evidence[{i}]: {why}"));
        }
    }
    if r.observations.len() > MAX_OBSERVATIONS {
        return Err(format!(
            "{} observations; the limit is {MAX_OBSERVATIONS}",
            r.observations.len()
        ));
    }
    for (i, o) in r.observations.iter().enumerate() {
        if o.kind.is_empty() || o.kind.len() > 120 {
            return Err(format!("observations[{i}].kind must be 1-120 bytes"));
        }
        let size = serde_json::to_string(&o.data).map(|s| s.len()).unwrap_or(0);
        if size > MAX_OBSERVATION_BYTES {
            return Err(format!(
                "observations[{i}].data is {size} bytes; the limit is {MAX_OBSERVATION_BYTES}"
            ));
        }
    }
    if let Some(o) = &r.monitor_observation
        && o.len() > MAX_OBSERVATION
    {
        return Err(format!(
            "monitor_observation is {} bytes; the limit is {MAX_OBSERVATION} (report a digest or a \
             summary)",
            o.len()
        ));
    }
    if r.proposals.len() > MAX_HOST_PROPOSALS {
        return Err(format!(
            "{} proposals; the limit is {MAX_HOST_PROPOSALS}",
            r.proposals.len()
        ));
    }
    Ok(())
}

/// The bytes the host reads on stdin: the journal's request with the result schema, which the
/// journal does not keep (the same text for every turn of this binary).
pub(super) fn host_stdin(request: &Value) -> Vec<u8> {
    let mut request = request.clone();
    if let Some(fields) = request.as_object_mut() {
        fields.insert("result_schema".to_string(), result_schema_hint());
    }
    serde_json::to_vec(&request).expect("request serializes")
}

/// The schema hint sent in every request, so a host can be written from the request alone.
pub fn result_schema_hint() -> Value {
    json!({
        "schema_version": RESULT_SCHEMA,
        "stdout": "exactly one JSON object; nothing else on stdout (use stderr for logs)",
        "max_stdout_bytes": MAX_STDOUT,
        "unknown_fields": "refused",
        "fields": {
            "schema_version": format!("required, \"{RESULT_SCHEMA}\""),
            "turn_key": "optional; when present must equal the request's turn_key",
            "status": format!("required, one of {}", HostStatus::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")),
            "summary": format!("string, at most {MAX_SUMMARY} bytes"),
            "evidence": format!("at most {MAX_EVIDENCE_ITEMS} of {{\"text\": string, \"artifact_path\"?: string}}"),
            "observations": format!("at most {MAX_OBSERVATIONS} of {{\"kind\": string, \"data\": any JSON}}, passed to the todo's capability"),
            "proposals": "optional kernel transitions (builtin:default capability only)",
            "monitor_observation": format!("optional string, at most {MAX_OBSERVATION} bytes: on a scheduled monitor todo, the check's observation (the same text as the last check's is no change); a monitor turn without one records a failed check"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "turn-k";

    fn nested(levels: usize) -> String {
        format!(
            r#"{{"schema_version":"{RESULT_SCHEMA}","status":"progress","observations":[{{"kind":"k","data":{}{}}}]}}"#,
            "[".repeat(levels),
            "]".repeat(levels)
        )
    }

    #[test]
    fn depth_counts_structure_not_brackets_in_strings() {
        assert_eq!(json_depth_over("{}", 1), None);
        assert_eq!(json_depth_over("[[]]", 1), Some(2));
        assert_eq!(json_depth_over(r#"{"a":"[[[[\"]]]]"}"#, 1), None);
        assert_eq!(json_depth_over(r#"["\\",[[]]]"#, 2), Some(3));
        // The scan stops at the first level over the limit.
        assert_eq!(json_depth_over(&"[".repeat(100_000), 64), Some(65));
    }

    #[test]
    fn results_deeper_than_the_limit_are_refused_before_parsing() {
        // Result object, observations array, observation object: data starts at level 4.
        assert!(parse_result_text(&nested(MAX_RESULT_DEPTH - 3), KEY).is_ok());
        let err = parse_result_text(&nested(MAX_RESULT_DEPTH - 2), KEY).unwrap_err();
        assert!(err.contains("the limit is 64"), "{err}");
        // Past serde_json's own limit the message is still ours, not the reader's.
        let err = parse_result_text(&nested(500), KEY).unwrap_err();
        assert!(err.contains("levels deep"), "{err}");
        let err = parse_result_text(&" ".repeat(MAX_STDOUT + 1), KEY).unwrap_err();
        assert!(err.contains("the limit is 65536"), "{err}");
    }

    #[test]
    fn a_monitor_observation_is_read_up_to_its_limit() {
        let with = |o: &str| {
            format!(
                r#"{{"schema_version":"{RESULT_SCHEMA}","status":"progress","monitor_observation":{}}}"#,
                serde_json::to_string(o).unwrap()
            )
        };
        let ok = parse_result_text(&with("p95 = 120 ms"), KEY).unwrap();
        assert_eq!(ok.monitor_observation.as_deref(), Some("p95 = 120 ms"));
        let err = parse_result_text(&with(&"x".repeat(MAX_OBSERVATION + 1)), KEY).unwrap_err();
        assert!(err.contains("monitor_observation"), "{err}");
        assert!(
            result_schema_hint()["fields"]["monitor_observation"].is_string(),
            "the host reads the field from the request's schema hint"
        );
    }

    #[test]
    fn unknown_fields_in_proposals_are_refused() {
        let text = format!(
            r#"{{"schema_version":"{RESULT_SCHEMA}","status":"progress","proposals":[{{"type":"no_change","reason":"r","bogus":1}}]}}"#
        );
        let err = parse_result_text(&text, KEY).unwrap_err();
        assert!(err.contains("bogus"), "{err}");
    }
}
