//! Turning a host result into kernel proposals: the built-in default capability, or the todo's
//! WebAssembly capability through the plugin host.
//!
//! Either way the output is a list of [`Transition`]s; the driver admits them with
//! `kernel::admission::admit_in_tx` inside the transaction that commits `durable_writeback`.

use serde_json::{Value, json};

use super::result::{HostResult, HostStatus};
use crate::kernel::Kernel;
use crate::kernel::transition::Transition;
use crate::plugin::error::PluginErrorKind;
use crate::plugin::{CapabilityInput, PluginHost};

/// The capability used when a todo names none.
pub const BUILTIN: &str = "builtin:default";

/// What the built-in default capability proposes for a host result.
///
/// * every evidence item → `attach_evidence` on the turn's todo;
/// * `completed` with a validated completion → `complete_todo`;
/// * `repair_required` → `block_todo` with the summary as the reason;
/// * `replan_required` → `request_replan`;
/// * `user_action_required` → `open_user_gate` blocking this agent;
/// * then the host's explicit `proposals`, in order;
/// * nothing at all → one `no_change` naming the status.
pub fn builtin_proposals(
    todo_id: &str,
    agent_id: &str,
    result: &HostResult,
    completion_validated: bool,
) -> Vec<Transition> {
    let mut out: Vec<Transition> = result
        .evidence
        .iter()
        .map(|e| Transition::AttachEvidence {
            todo_id: todo_id.to_string(),
            text: e.text.clone(),
            artifact_path: e.artifact_path.clone(),
            artifact_digest: None,
        })
        .collect();
    let summary = if result.summary.trim().is_empty() {
        format!("host reported {}", result.status)
    } else {
        result.summary.clone()
    };
    match result.status {
        HostStatus::Completed if completion_validated => out.push(Transition::CompleteTodo {
            todo_id: todo_id.to_string(),
            evidence: None,
        }),
        HostStatus::RepairRequired => out.push(Transition::BlockTodo {
            todo_id: todo_id.to_string(),
            reason: summary,
        }),
        HostStatus::ReplanRequired => out.push(Transition::RequestReplan { reason: summary }),
        HostStatus::UserActionRequired => {
            let short: String = summary.chars().take(200).collect();
            out.push(Transition::OpenUserGate {
                title: format!("Agent {agent_id} needs an operator on {todo_id}: {short}"),
                detail: summary,
                blocking: true,
                blocks_agent: Some(agent_id.to_string()),
            })
        }
        HostStatus::Progress | HostStatus::Completed | HostStatus::Wait => {}
    }
    out.extend(result.proposals.iter().cloned());
    if out.is_empty() {
        out.push(Transition::NoChange {
            reason: format!("host reported {}", result.status),
        });
    }
    out
}

/// Observation kind whose string `data` is handed to a WebAssembly capability verbatim, for
/// capabilities with their own input format (e.g. issue-fix's `key = value` lines).
pub const PAYLOAD_OBSERVATION: &str = "capability_payload";

/// The payload a WebAssembly capability receives: the `data` string of the host's
/// `capability_payload` observation when there is one, otherwise a `loopx.turn_observations.v1`
/// JSON document with the host's result and the turn identity.
pub fn capability_payload(
    turn_key: &str,
    todo_id: &str,
    result: &HostResult,
    completion_validated: bool,
) -> String {
    if let Some(text) = result
        .observations
        .iter()
        .find(|o| o.kind == PAYLOAD_OBSERVATION)
        .and_then(|o| o.data.as_str())
    {
        return text.to_string();
    }
    json!({
        "schema_version": "loopx.turn_observations.v1",
        "turn_key": turn_key,
        "todo_id": todo_id,
        "status": result.status,
        "completion_validated": completion_validated,
        "summary": result.summary,
        "evidence": result.evidence,
        "observations": result.observations,
    })
    .to_string()
}

/// Why a WebAssembly capability produced no proposals: the message, and the sandbox's failure
/// kind when the sandbox produced it.
#[derive(Debug, Clone)]
pub struct CapabilityFailure {
    pub message: String,
    pub plugin_failure: Option<PluginErrorKind>,
}

/// What a WebAssembly capability proposed: the batch, the call report, and the installed
/// revision that made it (for [`crate::kernel::transition::ProposalSource::revision`]).
pub struct CapabilityProposals {
    pub proposals: Vec<Transition>,
    pub call: Value,
    pub revision: Option<i64>,
}

/// Runs WebAssembly capability `name` (`<extension>/<capability>`) on the goal and returns its
/// proposals with the call report. Reads the goal snapshot; writes nothing.
pub fn wasm_proposals(
    kernel: &mut Kernel,
    name: &str,
    goal_id: &str,
    agent_id: &str,
    payload: String,
) -> Result<CapabilityProposals, CapabilityFailure> {
    let host = PluginHost::for_project(kernel.paths());
    let goal =
        crate::plugin::invoke::goal_view(kernel, goal_id).map_err(|e| CapabilityFailure {
            message: e.to_string(),
            plugin_failure: None,
        })?;
    let (cap, providers) = host
        .load_capability(kernel, name)
        .map_err(|e| CapabilityFailure {
            message: format!("capability {name} could not be loaded: {}", e.error),
            plugin_failure: e.plugin_kind,
        })?;
    let input = CapabilityInput {
        goal,
        agent_id: Some(agent_id.to_string()),
        payload,
    };
    let (result, call) = cap.propose(&input, providers);
    let call = serde_json::to_value(&call).unwrap_or(Value::Null);
    match result {
        Ok(proposals) => Ok(CapabilityProposals {
            proposals,
            call,
            revision: cap.revision,
        }),
        Err(e) => Err(CapabilityFailure {
            message: format!("capability {name} failed ({}): {e}", e.kind()),
            plugin_failure: Some(e.kind()),
        }),
    }
}
