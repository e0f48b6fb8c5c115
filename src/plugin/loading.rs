//! Loading a named component for an invocation: `<extension>/<id>` of a kind, enabled, with the
//! providers a capability declares.
//!
//! Why this exists: invoking a capability (`loopx capability invoke`, the turn driver) and calling
//! a provider start by resolving a name against the registry, and the failure must keep its plugin
//! error kind (`disabled`, `tampered`, ...) for the caller's report. The install pipeline in
//! `registry` does not need that error type, so resolving names lives here, between the registry
//! (which verifies and loads one revision's component) and `invoke` (which runs it).

use std::collections::HashMap;
use std::sync::Arc;

use crate::error::{LoopxError, not_found};
use crate::kernel::Kernel;

use super::error::PluginError;
use super::invoke::InvokeError;
use super::manifest::Kind;
use super::registry::{PluginHost, ext_not_found, record_manifest, split_name};
use super::sandbox::LoadedPlugin;

impl PluginHost {
    /// Loads `<extension>/<id>` of kind `kind` from the registry: it must exist and be enabled.
    /// Errors keep their plugin error kind (`tampered`, `disabled`, ...).
    pub fn load_named(
        &self,
        kernel: &mut Kernel,
        name: &str,
        kind: Kind,
    ) -> std::result::Result<LoadedPlugin, InvokeError> {
        let (ext, id) = split_name(name)?;
        let rec = kernel.extension(ext)?.ok_or_else(|| ext_not_found(ext))?;
        // What the extension provides is checked before whether it is enabled: a name it does not
        // provide is wrong either way, and enabling it would not help.
        let manifest = record_manifest(&rec)?;
        match manifest.provides(id) {
            Some(p) if p.kind == kind => {}
            Some(p) => {
                return Err(PluginError::BadRequest {
                    detail: format!("{name} is a {}, not a {}", p.kind.as_str(), kind.as_str()),
                }
                .into());
            }
            None => {
                return Err(not_found(format!(
                    "extension '{ext}' provides no {} '{id}' (it provides: {})",
                    kind.as_str(),
                    manifest
                        .provides
                        .iter()
                        .map(|p| format!("{} {}", p.kind.as_str(), p.id))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .into());
            }
        }
        if !rec.enabled {
            return Err(PluginError::Disabled {
                plugin: name.to_string(),
                extension: ext.to_string(),
            }
            .into());
        }
        Ok(self.load(kernel, &rec, id)?)
    }

    /// Loads a capability and the declared providers it may call (missing or disabled providers are
    /// left out: calls to them return `unavailable`).
    pub fn load_capability(
        &self,
        kernel: &mut Kernel,
        name: &str,
    ) -> std::result::Result<(LoadedPlugin, HashMap<String, Arc<LoadedPlugin>>), InvokeError> {
        let cap = self.load_named(kernel, name, Kind::Capability)?;
        let mut providers = HashMap::new();
        for u in &cap.uses {
            match self.load_named(kernel, u, Kind::Provider) {
                Ok(p) => {
                    providers.insert(u.clone(), Arc::new(p));
                }
                // Missing or disabled providers are left out; calls to them return `unavailable`.
                Err(InvokeError {
                    error: LoopxError::NotFound(_),
                    ..
                })
                | Err(InvokeError {
                    plugin_kind: Some(super::error::PluginErrorKind::Disabled),
                    ..
                }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((cap, providers))
    }
}
