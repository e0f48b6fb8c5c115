//! A capability that reads a file. Capabilities have no filesystem authority, so its component
//! imports `wasi:filesystem` and installing it must fail the import audit.

// The generated export glue for `propose` takes one argument per flattened field.
#![allow(clippy::too_many_arguments)]

wit_bindgen::generate!({ world: "capability", path: "../../../wit" });

struct FsCap;

impl Guest for FsCap {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "fs-cap".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "reads files it should not".into(),
            operations: vec![],
        }
    }

    fn propose(input: ProposeInput) -> Result<Vec<Transition>, PluginError> {
        let text = std::fs::read_to_string(&input.payload)
            .map_err(|e| PluginError::Failed(e.to_string()))?;
        Ok(vec![Transition::NoChange(text)])
    }
}

export!(FsCap);
