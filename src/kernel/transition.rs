//! Typed transition proposals: the only thing a capability can hand the kernel.
//!
//! The set is deliberately closed. There is no variant that resolves a gate, spends quota, changes
//! a claim or names another goal, so a capability cannot even express those writes; admission
//! (`kernel::admission`) then checks each proposal against current state before one transaction
//! commits the accepted ones.

use serde::{Deserialize, Serialize};

use crate::model::{Priority, TodoKind};

/// Largest text a proposal may carry in any one field, in bytes.
pub const MAX_PROPOSAL_TEXT: usize = 8 * 1024;
/// Most proposals admitted from one capability call.
pub const MAX_PROPOSALS_PER_CALL: usize = 256;

/// A change a capability asks the kernel to make to the goal it was invoked on.
///
/// Unknown fields are refused in every variant (`deny_unknown_fields` on an internally tagged
/// enum applies to each variant's fields, the `type` tag excepted): a proposal that says
/// `"bogus": 1` or misspells a field is an error, never silently reinterpreted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Transition {
    /// Add an agent todo. `id` lets a capability name it (so re-proposing is idempotent and later
    /// proposals in the same batch can depend on it); the kernel generates one when absent.
    AddTodo {
        id: Option<String>,
        title: String,
        detail: String,
        priority: Priority,
        kind: TodoKind,
        lane: Option<String>,
        depends_on: Vec<String>,
        capability: Option<String>,
    },
    /// Attach evidence to a todo of this goal.
    AttachEvidence {
        todo_id: String,
        text: String,
        artifact_path: Option<String>,
        artifact_digest: Option<String>,
    },
    /// Mark a todo completed (the calling agent must hold its lease if it is claimed).
    CompleteTodo {
        todo_id: String,
        evidence: Option<String>,
    },
    /// Mark a todo blocked, with the reason.
    BlockTodo { todo_id: String, reason: String },
    /// Defer a todo, with the reason.
    DeferTodo { todo_id: String, reason: String },
    /// Open a user gate (blocking) or user action (informing). Only an operator can resolve it.
    OpenUserGate {
        title: String,
        detail: String,
        blocking: bool,
        blocks_agent: Option<String>,
    },
    /// Ask for a replan of the goal's todo graph.
    RequestReplan { reason: String },
    /// Ask the scheduler to look again after a delay.
    ScheduleWake { after_seconds: u64, reason: String },
    /// Explicitly propose nothing, saying why.
    NoChange { reason: String },
}

impl Transition {
    /// The wire name of the variant, used in verdicts and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Transition::AddTodo { .. } => "add_todo",
            Transition::AttachEvidence { .. } => "attach_evidence",
            Transition::CompleteTodo { .. } => "complete_todo",
            Transition::BlockTodo { .. } => "block_todo",
            Transition::DeferTodo { .. } => "defer_todo",
            Transition::OpenUserGate { .. } => "open_user_gate",
            Transition::RequestReplan { .. } => "request_replan",
            Transition::ScheduleWake { .. } => "schedule_wake",
            Transition::NoChange { .. } => "no_change",
        }
    }
}

/// What a text field of a proposal holds, which decides the checks it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextField {
    /// Free text a person reads (a title, detail, evidence, a reason): admission bounds its size.
    Prose,
    /// A name or pointer (a todo id, lane, capability, artifact path or digest, agent id):
    /// checked by the code that uses it, not bounded as prose by admission; the plugin host
    /// bounds its size as it lifts it from a guest.
    Reference,
}

impl Transition {
    /// Every text field of the proposal, in declaration order, with its wire name and what it
    /// holds. The one list of them: admission checks the prose ones
    /// (`kernel::admission::check_proposal`) and the plugin host checks every one
    /// (`plugin::sandbox`), so a field added to a variant is added here once for both.
    pub fn text_fields(&self) -> Vec<(&'static str, TextField, &str)> {
        use TextField::{Prose, Reference};
        let mut v: Vec<(&'static str, TextField, &str)> = Vec::new();
        match self {
            Transition::AddTodo {
                id,
                title,
                detail,
                lane,
                depends_on,
                capability,
                priority: _,
                kind: _,
            } => {
                v.extend(id.as_deref().map(|id| ("id", Reference, id)));
                v.push(("title", Prose, title));
                v.push(("detail", Prose, detail));
                v.extend(lane.as_deref().map(|l| ("lane", Reference, l)));
                v.extend(
                    depends_on
                        .iter()
                        .map(|d| ("depends_on", Reference, d.as_str())),
                );
                v.extend(capability.as_deref().map(|c| ("capability", Reference, c)));
            }
            Transition::AttachEvidence {
                todo_id,
                text,
                artifact_path,
                artifact_digest,
            } => {
                v.push(("todo_id", Reference, todo_id));
                v.push(("text", Prose, text));
                v.extend(
                    artifact_path
                        .as_deref()
                        .map(|p| ("artifact_path", Reference, p)),
                );
                v.extend(
                    artifact_digest
                        .as_deref()
                        .map(|d| ("artifact_digest", Reference, d)),
                );
            }
            Transition::CompleteTodo { todo_id, evidence } => {
                v.push(("todo_id", Reference, todo_id));
                v.extend(evidence.as_deref().map(|e| ("evidence", Prose, e)));
            }
            Transition::BlockTodo { todo_id, reason }
            | Transition::DeferTodo { todo_id, reason } => {
                v.push(("todo_id", Reference, todo_id));
                v.push(("reason", Prose, reason));
            }
            Transition::OpenUserGate {
                title,
                detail,
                blocks_agent,
                blocking: _,
            } => {
                v.push(("title", Prose, title));
                v.push(("detail", Prose, detail));
                v.extend(
                    blocks_agent
                        .as_deref()
                        .map(|a| ("blocks_agent", Reference, a)),
                );
            }
            Transition::RequestReplan { reason }
            | Transition::ScheduleWake {
                reason,
                after_seconds: _,
            }
            | Transition::NoChange { reason } => v.push(("reason", Prose, reason)),
        }
        v
    }
}

/// Who proposed a batch, and on whose behalf: admission checks leases against `agent_id`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ProposalSource {
    pub goal_id: String,
    /// The agent whose turn produced the observations, when there is one.
    pub agent_id: Option<String>,
    /// `builtin:default` or `<extension>/<capability>`.
    pub capability: String,
    /// The turn the batch belongs to, when driven by the turn driver.
    pub turn_key: Option<String>,
    /// The installed revision of the extension whose component made the batch, when it ran one:
    /// admission takes the batch only while that revision is still installed and enabled, so an
    /// operator's `extension disable`, `remove` or `upgrade` during the call voids what it
    /// proposes. Absent from records written before it existed.
    #[serde(default)]
    pub revision: Option<i64>,
}

/// The kernel's decision on one proposal.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Verdict {
    pub index: usize,
    pub transition: String,
    pub accepted: bool,
    /// Why it was refused, or what acceptance did (e.g. "created todo_x").
    pub reason: String,
    /// The todo the proposal created or touched, when there is one.
    pub todo_id: Option<String>,
}

/// Outcome of admitting one batch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AdmissionReport {
    pub goal_id: String,
    pub capability: String,
    pub dry_run: bool,
    pub verdicts: Vec<Verdict>,
    pub accepted: usize,
    pub refused: usize,
    /// The run row recording the batch (absent on dry runs).
    pub run_id: Option<String>,
    /// Set when a proposal asked for a replan.
    pub replan_requested: bool,
    /// Seconds until the capability asked to be woken, when it did.
    pub wake_after_seconds: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_refused_in_every_variant() {
        let valid = [
            r#"{"type":"add_todo","id":null,"title":"t","detail":"","priority":"P2","kind":"task","lane":null,"depends_on":[],"capability":null}"#,
            r#"{"type":"attach_evidence","todo_id":"t1","text":"x","artifact_path":null,"artifact_digest":null}"#,
            r#"{"type":"complete_todo","todo_id":"t1","evidence":null}"#,
            r#"{"type":"block_todo","todo_id":"t1","reason":"r"}"#,
            r#"{"type":"defer_todo","todo_id":"t1","reason":"r"}"#,
            r#"{"type":"open_user_gate","title":"t","detail":"","blocking":true,"blocks_agent":null}"#,
            r#"{"type":"request_replan","reason":"r"}"#,
            r#"{"type":"schedule_wake","after_seconds":5,"reason":"r"}"#,
            r#"{"type":"no_change","reason":"r"}"#,
        ];
        for text in valid {
            let t: Transition =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            // Round trip: what is accepted serializes to something accepted again.
            let again: Transition =
                serde_json::from_str(&serde_json::to_string(&t).unwrap()).unwrap();
            assert_eq!(t, again);
            let bogus = format!("{},\"bogus\":1}}", &text[..text.len() - 1]);
            let err = serde_json::from_str::<Transition>(&bogus).unwrap_err();
            assert!(err.to_string().contains("bogus"), "{bogus}: {err}");
        }
        assert!(
            serde_json::from_str::<Transition>(r#"{"type":"resolve_gate","todo_id":"g"}"#).is_err()
        );
    }

    /// `text_fields` names every text a proposal carries, under its wire name: each variant with
    /// every optional field set, compared with the strings its JSON holds (less the tag and the
    /// enums, which are not free text).
    #[test]
    fn text_fields_name_every_text_of_every_variant() {
        let full = [
            r#"{"type":"add_todo","id":"i","title":"t","detail":"d","priority":"P2","kind":"task","lane":"l","depends_on":["a","b"],"capability":"c"}"#,
            r#"{"type":"attach_evidence","todo_id":"t1","text":"x","artifact_path":"p","artifact_digest":"d"}"#,
            r#"{"type":"complete_todo","todo_id":"t1","evidence":"e"}"#,
            r#"{"type":"block_todo","todo_id":"t1","reason":"r"}"#,
            r#"{"type":"defer_todo","todo_id":"t1","reason":"r"}"#,
            r#"{"type":"open_user_gate","title":"t","detail":"d","blocking":true,"blocks_agent":"a"}"#,
            r#"{"type":"request_replan","reason":"r"}"#,
            r#"{"type":"schedule_wake","after_seconds":5,"reason":"r"}"#,
            r#"{"type":"no_change","reason":"r"}"#,
        ];
        for text in full {
            let t: Transition = serde_json::from_str(text).unwrap();
            let json: serde_json::Value = serde_json::from_str(text).unwrap();
            let mut expected: Vec<(String, String)> = Vec::new();
            for (key, value) in json.as_object().unwrap() {
                if matches!(key.as_str(), "type" | "priority" | "kind") {
                    continue;
                }
                let strings: Vec<&serde_json::Value> = match value {
                    serde_json::Value::Array(items) => items.iter().collect(),
                    other => vec![other],
                };
                for s in strings.into_iter().filter_map(|v| v.as_str()) {
                    expected.push((key.clone(), s.to_string()));
                }
            }
            let mut actual: Vec<(String, String)> = t
                .text_fields()
                .into_iter()
                .map(|(name, _, value)| (name.to_string(), value.to_string()))
                .collect();
            expected.sort();
            actual.sort();
            assert_eq!(actual, expected, "{text}");
        }
    }
}
