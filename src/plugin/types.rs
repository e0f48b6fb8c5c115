//! Plain Rust types of the plugin API (no wasmtime in sight).
//!
//! Why this exists: the CLI, the turn driver and tests build inputs and read outputs with these
//! serde-friendly structs; `bindings` converts them to and from the generated WIT types.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Goal, Priority, Todo, TodoKind, TodoStatus};

/// A key/value finding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fact {
    pub key: String,
    pub value: String,
}

/// A provider request (the JSON shape of `loopx provider call --input FILE`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObserveRequest {
    pub operation: String,
    #[serde(default)]
    pub target: String,
    #[serde(default)]
    pub params: BTreeMap<String, String>,
}

/// What a provider observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// `<extension>/<provider>`, set by the host.
    pub source: String,
    pub kind: String,
    pub summary: String,
    pub facts: Vec<Fact>,
    pub body: String,
    pub truncated: bool,
}

/// A component's self-description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub description: String,
    pub operations: Vec<String>,
}

/// A todo as a capability sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TodoView {
    pub id: String,
    pub title: String,
    pub detail: String,
    pub status: TodoStatus,
    pub priority: Priority,
    pub kind: TodoKind,
    pub lane: Option<String>,
    pub depends_on: Vec<String>,
    pub claim_holder: Option<String>,
    pub capability: Option<String>,
}

/// The goal a capability is invoked on, as it sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GoalView {
    pub goal_id: String,
    pub title: String,
    pub objective: String,
    pub success_criteria: Vec<String>,
    pub todos: Vec<TodoView>,
}

impl GoalView {
    /// Builds the view from kernel records; `now_ms` decides which claims are still live.
    pub fn from_kernel(goal: &Goal, todos: &[Todo], now_ms: i64) -> GoalView {
        GoalView {
            goal_id: goal.id.clone(),
            title: goal.title.clone(),
            objective: goal.objective.clone(),
            success_criteria: goal.success_criteria.clone(),
            todos: todos
                .iter()
                .map(|t| TodoView {
                    id: t.id.clone(),
                    title: t.title.clone(),
                    detail: t.detail.clone(),
                    status: t.status,
                    priority: t.priority,
                    kind: t.kind,
                    lane: t.lane.clone(),
                    depends_on: t.depends_on.clone(),
                    claim_holder: t.live_claim(now_ms).map(|c| c.agent_id.clone()),
                    capability: t.capability.clone(),
                })
                .collect(),
        }
    }
}

/// What `propose` receives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityInput {
    pub goal: GoalView,
    pub agent_id: Option<String>,
    pub payload: String,
}

/// One provider call a capability made during `propose`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProviderCall {
    pub provider: String,
    pub operation: String,
    pub target: String,
    /// `ok`, or the error kind (`denied`, `not_declared`, `deadline`, ...).
    pub outcome: String,
    pub detail: String,
}
