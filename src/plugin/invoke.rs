//! Invoking a capability against a goal and handing its proposals to kernel admission.
//!
//! Why this exists: `loopx capability invoke`, the turn driver and the tests must all take the same
//! path: read the goal snapshot, run the capability in its sandbox (with its declared providers),
//! and, only if the call succeeded as a whole, pass the proposals to `Kernel::admit` (which checks
//! each against current state and commits the accepted ones in one transaction, or rolls back on a
//! dry run). A sandbox failure never reaches admission, so it writes nothing.

use serde::Serialize;

use crate::clock::now_ms;
use crate::error::LoopxError;
use crate::kernel::Kernel;
use crate::kernel::transition::{AdmissionReport, ProposalSource, Transition};

use super::error::PluginError;
use super::manifest::Kind;
use super::registry::PluginHost;
use super::sandbox::CallReport;
use super::types::{CapabilityInput, GoalView, Observation, ObserveRequest};

/// A successful invocation: what the capability proposed and what the kernel decided.
#[derive(Debug, Clone, Serialize)]
pub struct InvokeOutcome {
    pub capability: String,
    pub goal_id: String,
    pub agent_id: Option<String>,
    pub proposals: Vec<Transition>,
    pub admission: AdmissionReport,
    pub call: CallReport,
}

/// A failed invocation: the error (already mapped for the CLI), the plugin error kind when the
/// sandbox produced it, and whatever the call captured (logs, provider calls) before failing.
#[derive(Debug)]
pub struct InvokeError {
    pub error: LoopxError,
    pub plugin_kind: Option<super::error::PluginErrorKind>,
    pub call: Option<Box<CallReport>>,
}

impl From<LoopxError> for InvokeError {
    fn from(error: LoopxError) -> InvokeError {
        InvokeError {
            error,
            plugin_kind: None,
            call: None,
        }
    }
}

impl From<PluginError> for InvokeError {
    fn from(e: PluginError) -> InvokeError {
        InvokeError {
            plugin_kind: Some(e.kind()),
            error: e.into(),
            call: None,
        }
    }
}

impl std::fmt::Display for InvokeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.error)
    }
}

/// The goal as the capability will see it.
pub fn goal_view(kernel: &mut Kernel, goal_id: &str) -> Result<GoalView, LoopxError> {
    let goal = kernel.goal(goal_id)?;
    let todos = kernel.todos(goal_id)?;
    Ok(GoalView::from_kernel(&goal, &todos, now_ms()))
}

/// Runs capability `name` (`<extension>/<capability>`) on `goal_id` and admits its proposals.
pub fn invoke_capability(
    kernel: &mut Kernel,
    host: &PluginHost,
    name: &str,
    goal_id: &str,
    agent_id: Option<&str>,
    payload: String,
    dry_run: bool,
) -> Result<InvokeOutcome, InvokeError> {
    let goal = goal_view(kernel, goal_id)?;
    let (cap, providers) = host.load_capability(kernel, name)?;
    let input = CapabilityInput {
        goal,
        agent_id: agent_id.map(str::to_string),
        payload,
    };
    let (result, call) = cap.propose(&input, providers);
    let proposals = match result {
        Ok(p) => p,
        Err(e) => {
            return Err(InvokeError {
                plugin_kind: Some(e.kind()),
                error: e.into(),
                call: Some(Box::new(call)),
            });
        }
    };
    let source = ProposalSource {
        goal_id: goal_id.to_string(),
        agent_id: agent_id.map(str::to_string),
        capability: name.to_string(),
        turn_key: None,
        revision: cap.revision,
    };
    let admission = kernel
        .admit(&source, &proposals, dry_run)
        .map_err(|error| InvokeError {
            error,
            plugin_kind: None,
            call: Some(Box::new(call.clone())),
        })?;
    Ok(InvokeOutcome {
        capability: name.to_string(),
        goal_id: goal_id.to_string(),
        agent_id: agent_id.map(str::to_string),
        proposals,
        admission,
        call,
    })
}

/// Calls provider `name` (`<extension>/<provider>`) directly (operator use; reads nothing from and
/// writes nothing to kernel state).
pub fn call_provider(
    kernel: &mut Kernel,
    host: &PluginHost,
    name: &str,
    request: &ObserveRequest,
) -> Result<(Observation, CallReport), InvokeError> {
    let provider = std::sync::Arc::new(host.load_named(kernel, name, Kind::Provider)?);
    let (result, call) = provider.observe(request);
    match result {
        Ok(o) => Ok((o, call)),
        Err(e) => Err(InvokeError {
            plugin_kind: Some(e.kind()),
            error: e.into(),
            call: Some(Box::new(call)),
        }),
    }
}
