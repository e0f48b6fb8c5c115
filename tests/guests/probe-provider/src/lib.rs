//! A provider that tries whatever its request says, for the sandbox test suite.
//!
//! `read PATH`, `write PATH`, `env NAME`, `list DIR`: each is attempted with plain `std`, so the test
//! proves the refusal comes from the host's WASI grants, not from the guest being polite. `sleep MS`
//! blocks in a WASI clock wait, to prove the call's deadline still holds there.

wit_bindgen::generate!({ world: "provider", path: "../../../wit" });

struct Probe;

fn obs(kind: &str, summary: String, body: String) -> Observation {
    Observation {
        source: String::new(),
        kind: kind.into(),
        summary,
        facts: vec![],
        body,
        truncated: false,
    }
}

impl Guest for Probe {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "probe".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "attempts reads, writes and env lookups".into(),
            operations: vec![
                "read".into(),
                "write".into(),
                "env".into(),
                "list".into(),
                "sleep".into(),
            ],
        }
    }

    fn observe(request: ObserveRequest) -> Result<Observation, PluginError> {
        let t = request.target.as_str();
        match request.operation.as_str() {
            "read" => std::fs::read_to_string(t)
                .map(|s| obs("file", format!("read {} bytes", s.len()), s))
                .map_err(|e| PluginError::Denied(format!("read {t}: {e}"))),
            "write" => std::fs::write(t, b"written by probe")
                .map(|()| obs("file", format!("wrote {t}"), String::new()))
                .map_err(|e| PluginError::Denied(format!("write {t}: {e}"))),
            "env" => std::env::var(t)
                .map(|v| obs("env", format!("{t} is set"), v))
                .map_err(|e| PluginError::Unavailable(format!("env {t}: {e}"))),
            "list" => std::fs::read_dir(t)
                .map(|rd| {
                    let names: Vec<String> = rd
                        .filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect();
                    obs(
                        "listing",
                        format!("{} entries", names.len()),
                        names.join("\n"),
                    )
                })
                .map_err(|e| PluginError::Denied(format!("list {t}: {e}"))),
            "sleep" => {
                let ms: u64 = t.parse().unwrap_or(60_000);
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(obs("sleep", format!("slept {ms} ms"), String::new()))
            }
            other => Err(PluginError::InvalidInput(format!(
                "unknown operation {other}"
            ))),
        }
    }
}

export!(Probe);
