//! A provider that opens a TCP connection: its component imports `wasi:sockets`, which no LoopX
//! permission grants, so installing it must fail.

wit_bindgen::generate!({ world: "provider", path: "../../../wit" });

struct Net;

impl Guest for Net {
    fn describe() -> PluginInfo {
        PluginInfo {
            name: "net".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "connects to the network".into(),
            operations: vec!["connect".into()],
        }
    }

    fn observe(request: ObserveRequest) -> Result<Observation, PluginError> {
        match std::net::TcpStream::connect(request.target.as_str()) {
            Ok(_) => Ok(Observation {
                source: String::new(),
                kind: "net".into(),
                summary: "connected".into(),
                facts: vec![],
                body: String::new(),
                truncated: false,
            }),
            Err(e) => Err(PluginError::Failed(e.to_string())),
        }
    }
}

export!(Net);
