//! The dashboard's API and safety checks, driven through the router in-process: every route
//! answers in the shape its OpenAPI document promises, nothing it serves changes the database,
//! and the host, token, header and method rules hold.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use loopx::kernel::claim::ClaimRequest;
use loopx::kernel::goal::NewGoal;
use loopx::kernel::quota::SpendRequest;
use loopx::kernel::run::RefreshRequest;
use loopx::kernel::todo::{NewTodo, TodoPatch};
use loopx::kernel::{Actor, Kernel};
use loopx::model::{ExtensionRecord, GateScope, JournalStatus, Phase, TodoKind, TurnRecord};
use loopx::paths::ProjectPaths;
use loopx_serve::{CONTENT_SECURITY_POLICY, Config, OPENAPI_JSON, router};
use serde_json::Value;
use tower::ServiceExt;

const HOSTILE: &str = "<img src=x onerror=alert(1)> <script>alert(2)</script> \u{202e}evil";

/// A project with a goal, three todos (one claimed, one depending on it, one gate), evidence,
/// two runs with a reward, and a spend: something on every page. Returns the run ids.
fn seed() -> (tempfile::TempDir, ProjectPaths, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut k = Kernel::init(dir.path()).unwrap().unwrap();
    let op = Actor::Operator;
    k.create_goal(
        &op,
        NewGoal {
            id: Some("g".into()),
            title: format!("Goal {HOSTILE}"),
            ..NewGoal::default()
        },
    )
    .unwrap();
    let mut t1 = NewTodo::task(format!("Task {HOSTILE}"));
    t1.id = Some("t1".into());
    k.add_todo(&op, "g", t1).unwrap();
    let mut t2 = NewTodo::task("Second");
    t2.id = Some("t2".into());
    t2.depends_on = vec!["t1".into()];
    k.add_todo(&op, "g", t2).unwrap();
    let mut gate = NewTodo::task("Approve the release");
    gate.id = Some("gate1".into());
    gate.kind = TodoKind::UserGate;
    // Blocks an agent that is not the one working here, so bob's claim below goes through.
    gate.gate_scope = Some(GateScope::BlocksAgent {
        agent_id: "dave".into(),
    });
    k.add_todo(&op, "g", gate).unwrap();
    let grant = k
        .claim(&ClaimRequest {
            goal_id: "g".into(),
            todo_id: Some("t1".into()),
            agent_id: "bob".into(),
            ttl_seconds: 600,
            idempotency_key: None,
        })
        .unwrap();
    let bob = loopx::kernel::claim::agent_actor("bob", Some(grant.claim.fence), None, None);
    let patch = TodoPatch {
        evidence: Some(format!("evidence {HOSTILE}")),
        ..TodoPatch::default()
    };
    k.update_todo(&bob, "g", "t1", patch).unwrap();
    let mut runs = Vec::new();
    for summary in ["first run", &format!("summary {HOSTILE}")] {
        let run = k
            .refresh_state(
                &bob,
                &RefreshRequest {
                    goal_id: "g".into(),
                    agent_id: Some("bob".into()),
                    todo_id: Some("t1".into()),
                    classification: Some("progress".into()),
                    outcome: None,
                    summary: Some(summary.to_string()),
                },
            )
            .unwrap();
        runs.push(run.id);
    }
    k.add_reward(&op, "g", &runs[0], 2.0, "good").unwrap();
    k.spend(
        &bob,
        &SpendRequest {
            goal_id: "g".into(),
            agent_id: Some("bob".into()),
            slots: 1,
            effect_id: None,
        },
    )
    .unwrap();
    // A journal row and an installed extension, written straight into the store (test builds
    // only: the kernel's `write`), so the turn and extension routes answer with data.
    let now = loopx::clock::now_ms();
    k.write(|tx| {
        tx.upsert_turn(&TurnRecord {
            turn_key: "turn-1".into(),
            goal_id: "g".into(),
            agent_id: "bob".into(),
            todo_id: Some("t1".into()),
            status: JournalStatus::InProgress,
            phases: vec![Phase::HostExecute],
            data: serde_json::json!({"kind": null, "timeout_ms": 1000}),
            created_at: now,
            updated_at: now,
            data_error: None,
        })?;
        tx.upsert_extension(&ExtensionRecord {
            id: "demo".into(),
            version: "0.1.0".into(),
            enabled: true,
            manifest: serde_json::json!({
                "id": "demo", "version": "0.1.0", "api": ">=0.1, <0.2",
                "permissions": ["fs.read:workspace"],
                "provides": [{"kind": "provider", "id": "p", "component": "p.wasm",
                              "limits": {"deadline_ms": 3000}}],
            }),
            grants: vec!["fs.read:workspace=/srv/data".into()],
            install_dir: "/nonexistent/demo".into(),
            component_hashes: serde_json::json!({"p": "ab".repeat(32)}),
            installed_at: now,
            revision: 1,
        })
    })
    .unwrap();
    let paths = ProjectPaths::at(dir.path());
    (dir, paths, runs)
}

const LISTEN: &str = "127.0.0.1:7878";

fn app(paths: &ProjectPaths, listen: &str, token: Option<&str>) -> Router {
    let (changes, _) = tokio::sync::broadcast::channel(4);
    router(
        Config {
            paths: paths.clone(),
            listen: listen.parse::<SocketAddr>().unwrap(),
            token: token.map(str::to_string),
        },
        changes,
    )
}

fn get(uri: &str) -> Request<Body> {
    Request::builder()
        .uri(uri)
        .header(header::HOST, LISTEN)
        .body(Body::empty())
        .unwrap()
}

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, axum::http::HeaderMap, String) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// Every JSON route of the document, with the path parameters of the seeded project, and the
/// schema (by name) its 200 answer must match.
fn json_routes(runs: &[String]) -> Vec<(String, &'static str)> {
    vec![
        ("/api/v1/status".into(), "Status"),
        ("/api/v1/goals".into(), "GoalList"),
        ("/api/v1/goals/g".into(), "GoalShow"),
        ("/api/v1/goals/g/todos".into(), "TodoList"),
        ("/api/v1/goals/g/todos/t1".into(), "TodoShow"),
        ("/api/v1/goals/g/gates".into(), "GateList"),
        ("/api/v1/goals/g/quota".into(), "QuotaShow"),
        (
            "/api/v1/goals/g/should-run?agent_id=bob".into(),
            "ShouldRun",
        ),
        ("/api/v1/goals/g/summary".into(), "Summary"),
        ("/api/v1/goals/g/history?limit=1".into(), "History"),
        (
            format!("/api/v1/goals/g/history?limit=1&before={}", runs[1]),
            "History",
        ),
        (format!("/api/v1/goals/g/runs/{}", runs[1]), "RunReport"),
        ("/api/v1/turns".into(), "TurnList"),
        (
            "/api/v1/turns?goal_id=g&status=in_progress&limit=5".into(),
            "TurnList",
        ),
        ("/api/v1/turns/turn-1".into(), "TurnShow"),
        ("/api/v1/extensions".into(), "ExtensionList"),
        ("/api/v1/extensions/demo".into(), "ExtensionShow"),
    ]
}

fn validator(schema: &str) -> jsonschema::Validator {
    let mut doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    doc["$ref"] = Value::String(format!("#/components/schemas/{schema}"));
    jsonschema::draft202012::new(&doc).unwrap()
}

fn check(schema: &str, uri: &str, body: &str) {
    let value: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{uri}: {e}: {body}"));
    let errors: Vec<String> = validator(schema)
        .iter_errors(&value)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "{uri} does not match {schema}: {errors:#?}"
    );
}

/// Every table's rows, sorted: what "nothing changed" means below the file's bytes.
fn tables(paths: &ProjectPaths) -> Vec<(String, Vec<String>)> {
    let conn = rusqlite::Connection::open_with_flags(
        paths.db(),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let names: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    names
        .into_iter()
        .map(|name| {
            let mut stmt = conn.prepare(&format!("SELECT * FROM \"{name}\"")).unwrap();
            let columns = stmt.column_count();
            let mut rows: Vec<String> = stmt
                .query_map([], |r| {
                    let mut cells = Vec::new();
                    for i in 0..columns {
                        let v: rusqlite::types::Value = r.get(i)?;
                        cells.push(format!("{v:?}"));
                    }
                    Ok(cells.join("|"))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            rows.sort();
            (name, rows)
        })
        .collect()
}

fn file_hash(path: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    match std::fs::read(path) {
        Ok(bytes) => hex(&Sha256::digest(bytes)),
        Err(_) => "absent".into(),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn every_route_answers_in_the_shape_its_openapi_document_gives() {
    let (_dir, paths, runs) = seed();
    let app = app(&paths, LISTEN, None);
    for (uri, schema) in json_routes(&runs) {
        let (status, headers, body) = send(&app, get(&uri)).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json", "{uri}");
        check(schema, &uri, &body);
    }
    // The one-item history page names the next page, and the next page holds the older run.
    let (_, _, first) = send(&app, get("/api/v1/goals/g/history?limit=1")).await;
    let first: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["runs"][0]["run_id"], runs[1].as_str());
    assert_eq!(first["runs"][0]["summary"], format!("summary {HOSTILE}"));
    let next = first["next_before"].as_str().unwrap();
    let (_, _, older) = send(
        &app,
        get(&format!("/api/v1/goals/g/history?limit=1&before={next}")),
    )
    .await;
    let older: Value = serde_json::from_str(&older).unwrap();
    assert_eq!(older["runs"][0]["run_id"], runs[0].as_str());
    assert_eq!(older["runs"][0]["rewards"][0]["score"], 2.0);
    // One run's report holds its rewards and the evidence its todo held, as the agent wrote it.
    let uri = format!("/api/v1/goals/g/runs/{}", runs[0]);
    let (_, _, report) = send(&app, get(&uri)).await;
    check("RunReport", &uri, &report);
    let report: Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["run"]["rewards"][0]["score"], 2.0);
    assert_eq!(report["run"]["rewards"][0]["comment"], "good");
    assert_eq!(report["evidence"][0]["text"], format!("evidence {HOSTILE}"));
    // The quota's spend series: 48 spans of the window, the seeded spend in the last one.
    let (_, _, quota) = send(&app, get("/api/v1/goals/g/quota")).await;
    let quota: Value = serde_json::from_str(&quota).unwrap();
    let spans: Vec<i64> = quota["spend_series"]["net_slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_i64().unwrap())
        .collect();
    assert_eq!(spans.len(), 48);
    assert_eq!(spans.iter().sum::<i64>(), quota["quota"]["spent_slots"]);
    assert_eq!(spans[47], 1);
    // The routes with data hold it: the turn and the extension's component, digest and grant.
    let (_, _, turns) = send(&app, get("/api/v1/turns")).await;
    let turns: Value = serde_json::from_str(&turns).unwrap();
    assert_eq!(turns["turns"][0]["turn_key"], "turn-1");
    let (_, _, ext) = send(&app, get("/api/v1/extensions/demo")).await;
    let ext: Value = serde_json::from_str(&ext).unwrap();
    assert_eq!(ext["extension"]["components"][0]["sha256"], "ab".repeat(32));
    assert_eq!(ext["extension"]["grants"][0], "fs.read:workspace=/srv/data");
    // The document itself is served, and names every route the router has.
    let (status, _, doc) = send(&app, get("/api/v1/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    let doc: Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for (uri, _) in json_routes(&runs) {
        let path = uri.split('?').next().unwrap();
        let templated = doc["paths"]
            .as_object()
            .unwrap()
            .keys()
            .any(|p| route_matches(p, path));
        assert!(templated, "{path} is not in the OpenAPI document");
    }
}

fn route_matches(template: &str, path: &str) -> bool {
    let t: Vec<_> = template.split('/').collect();
    let p: Vec<_> = path.split('/').collect();
    t.len() == p.len() && t.iter().zip(&p).all(|(a, b)| a.starts_with('{') || a == b)
}

#[tokio::test]
async fn errors_are_the_cli_envelope_with_an_http_status_per_kind() {
    let (_dir, paths, _) = seed();
    let app = app(&paths, LISTEN, None);
    for (uri, status) in [
        ("/api/v1/goals/nope", StatusCode::NOT_FOUND),
        ("/api/v1/goals/g/todos/nope", StatusCode::NOT_FOUND),
        ("/api/v1/goals/g/runs/01NOPE", StatusCode::NOT_FOUND),
        ("/api/v1/goals/g/history?limit=0", StatusCode::BAD_REQUEST),
        (
            "/api/v1/goals/g/history?before=..%2Fx",
            StatusCode::BAD_REQUEST,
        ),
        ("/api/v1/turns?status=bogus", StatusCode::BAD_REQUEST),
        ("/api/v1/extensions/nope", StatusCode::NOT_FOUND),
    ] {
        let (got, _, body) = send(&app, get(uri)).await;
        assert_eq!(got, status, "{uri}: {body}");
        check("Error", uri, &body);
    }
    // A path segment that looks like a flag stays a value: it names no goal.
    let (got, _, body) = send(&app, get("/api/v1/goals/--help")).await;
    assert!(
        got == StatusCode::BAD_REQUEST || got == StatusCode::NOT_FOUND,
        "{body}"
    );
    check("Error", "/api/v1/goals/--help", &body);
}

#[tokio::test]
async fn serving_every_route_changes_neither_the_database_file_nor_any_table() {
    let (_dir, paths, runs) = seed();
    let db = paths.db();
    let mut wal = db.clone().into_os_string();
    wal.push("-wal");
    let wal = std::path::PathBuf::from(wal);
    let before = (file_hash(&db), file_hash(&wal), tables(&paths));
    let app = app(&paths, LISTEN, None);
    let mut uris: Vec<String> = json_routes(&runs).into_iter().map(|(u, _)| u).collect();
    uris.extend(
        [
            "/",
            "/app.js",
            "/app.css",
            "/api/v1/openapi.json",
            "/api/v1/goals/nope",
            "/api/v1/goals/g/should-run",
        ]
        .map(String::from),
    );
    for uri in &uris {
        for method in [
            Method::GET,
            Method::HEAD,
            Method::POST,
            Method::PUT,
            Method::DELETE,
        ] {
            let request = Request::builder()
                .method(method)
                .uri(uri.as_str())
                .header(header::HOST, LISTEN)
                .body(Body::empty())
                .unwrap();
            send(&app, request).await;
        }
    }
    let after = (file_hash(&db), file_hash(&wal), tables(&paths));
    assert_eq!(before.0, after.0, "the database file changed");
    assert_eq!(before.1, after.1, "the write-ahead log changed");
    assert_eq!(before.2, after.2, "a table's rows changed");
}

/// A database whose schema is older than the server reads (a project last used by an older
/// `loopx`, or one restored under the running server) is not upgraded by a read: every route
/// answers 409 naming the fix, and the file stays as it was, version included.
#[tokio::test]
async fn a_schema_older_than_the_server_reads_is_refused_not_upgraded() {
    let (_dir, paths, runs) = seed();
    let db = paths.db();
    let version = |c: &rusqlite::Connection| -> i64 {
        c.query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap()
    };
    let older = {
        let c = rusqlite::Connection::open(&db).unwrap();
        let older = version(&c) - 1;
        c.pragma_update(None, "user_version", older).unwrap();
        c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        older
    };
    let before = file_hash(&db);
    let app = app(&paths, LISTEN, None);
    for (uri, _) in json_routes(&runs) {
        let (status, _, body) = send(&app, get(&uri)).await;
        assert_eq!(status, StatusCode::CONFLICT, "{uri}: {body}");
        let envelope: Value = serde_json::from_str(&body).unwrap();
        let message = envelope["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("schema version {older}")),
            "{message}"
        );
        assert!(message.contains("loopx goal list"), "{message}");
    }
    assert_eq!(file_hash(&db), before, "the database file changed");
    let c = rusqlite::Connection::open(&db).unwrap();
    assert_eq!(version(&c), older, "the schema was upgraded by a read");
}

/// Open pages' event streams have a bound of their own below the server's connection limit, so
/// they can never take every connection from the operator's requests: past it a stream is
/// refused (503, the JSON envelope, `Retry-After`), and a closed stream frees its place.
#[tokio::test]
async fn event_streams_past_their_limit_are_refused_and_a_closed_one_frees_its_place() {
    use loopx_serve::{MAX_CONNECTIONS, MAX_EVENT_STREAMS};
    const { assert!(MAX_EVENT_STREAMS < MAX_CONNECTIONS / 2) };
    let (_dir, paths, _) = seed();
    let app = app(&paths, LISTEN, None);
    let mut open = Vec::new();
    for _ in 0..MAX_EVENT_STREAMS {
        let response = app.clone().oneshot(get("/api/v1/events")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        open.push(response);
    }
    let (status, headers, body) = send(&app, get("/api/v1/events")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(headers[header::RETRY_AFTER], "5");
    let envelope: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(envelope["error"]["kind"], "io", "{envelope}");
    assert!(
        envelope["error"]["message"]
            .as_str()
            .unwrap()
            .contains("event streams are open"),
        "{envelope}"
    );
    // Other requests are still answered.
    let (status, _, _) = send(&app, get("/api/v1/status")).await;
    assert_eq!(status, StatusCode::OK);
    drop(open.pop());
    let response = app.clone().oneshot(get("/api/v1/events")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

#[tokio::test]
async fn no_write_method_is_routed() {
    let (_dir, paths, runs) = seed();
    let app = app(&paths, LISTEN, None);
    for (uri, _) in json_routes(&runs) {
        for method in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            let request = Request::builder()
                .method(method.clone())
                .uri(uri.as_str())
                .header(header::HOST, LISTEN)
                .body(Body::from("{}"))
                .unwrap();
            let (status, headers, _) = send(&app, request).await;
            assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
            assert_eq!(
                headers[header::CONTENT_SECURITY_POLICY],
                CONTENT_SECURITY_POLICY
            );
        }
    }
}

#[tokio::test]
async fn every_response_carries_the_content_security_policy_and_nosniff_and_no_cors() {
    let (_dir, paths, _) = seed();
    let app = app(&paths, LISTEN, None);
    for uri in [
        "/",
        "/app.js",
        "/api/v1/status",
        "/api/v1/goals/nope",
        "/nothing",
    ] {
        let request = Request::builder()
            .uri(uri)
            .header(header::HOST, LISTEN)
            .header(header::ORIGIN, "http://evil.example")
            .body(Body::empty())
            .unwrap();
        let (_, headers, _) = send(&app, request).await;
        let csp = headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("default-src 'self'"), "{uri}: {csp}");
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff", "{uri}");
        assert!(
            headers.get(header::ACCESS_CONTROL_ALLOW_ORIGIN).is_none(),
            "{uri}"
        );
    }
    // The page has no inline script and loads nothing from elsewhere.
    let (_, _, page) = send(&app, get("/")).await;
    assert!(page.contains("<script src=\"/app.js\" defer></script>"));
    assert_eq!(page.matches("<script").count(), 1);
    assert!(!page.contains("http://") && !page.contains("https://"));
    // The script puts store text on the page as text only.
    let (_, _, js) = send(&app, get("/app.js")).await;
    assert!(!js.contains("innerHTML") && !js.contains("outerHTML"));
    assert!(!js.contains("insertAdjacentHTML") && !js.contains("document.write"));
    // Its first line is the set of characters the CLI shows as escapes, from loopx::inert.
    let first = js.lines().next().unwrap();
    assert!(
        first.starts_with("const HIDDEN = /[\\u{0}-\\u{1f}"),
        "{first}"
    );
    assert!(first.contains("\\u{2028}-\\u{202e}"), "{first}");
}

#[tokio::test]
async fn a_request_for_another_host_is_refused() {
    let (_dir, paths, _) = seed();
    let app = app(&paths, LISTEN, None);
    for host in [
        "evil.example:7878",
        "attacker.example",
        "127.0.0.1:8080",
        "localhost.evil.example:7878",
        "10.0.0.1:7878",
        // Misspelled forms of allowed names: brackets only around IPv6, a plain port.
        "[localhost]:7878",
        "localhost]:7878",
        "[127.0.0.1]:7878",
        "::1:7878",
        "localhost:07878",
        "localhost:+7878",
        "[::1]x:7878",
    ] {
        let request = Request::builder()
            .uri("/api/v1/status")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        let (status, headers, _) = send(&app, request).await;
        assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{host}");
        assert!(headers.contains_key(header::CONTENT_SECURITY_POLICY));
    }
    let request = Request::builder()
        .uri("/api/v1/status")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, request).await.0, StatusCode::MISDIRECTED_REQUEST);
    // Two Host headers, or a request target naming another host, are refused too.
    let request = Request::builder()
        .uri("/api/v1/status")
        .header(header::HOST, "127.0.0.1:7878")
        .header(header::HOST, "evil.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, request).await.0, StatusCode::MISDIRECTED_REQUEST);
    let request = Request::builder()
        .uri("http://evil.example/api/v1/status")
        .header(header::HOST, "127.0.0.1:7878")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, request).await.0, StatusCode::MISDIRECTED_REQUEST);
    for host in [
        "127.0.0.1:7878",
        "localhost:7878",
        "LOCALHOST:7878",
        "[::1]:7878",
    ] {
        let request = Request::builder()
            .uri("/api/v1/status")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, request).await.0, StatusCode::OK, "{host}");
    }
}

#[tokio::test]
async fn with_a_token_every_request_must_carry_it() {
    let (_dir, paths, _) = seed();
    let listen = "0.0.0.0:7878";
    let app = app(&paths, listen, Some("s3cret-token"));
    let at = |uri: &str| {
        Request::builder()
            .uri(uri)
            .header(header::HOST, "192.0.2.7:7878")
    };
    for uri in ["/", "/app.js", "/api/v1/status", "/api/v1/events"] {
        let (status, _, _) = send(&app, at(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri} without a token");
        let wrong = at(uri)
            .header(header::AUTHORIZATION, "Bearer s3cret-tokeX")
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, wrong).await.0, StatusCode::UNAUTHORIZED, "{uri}");
    }
    let bearer = at("/api/v1/status")
        .header(header::AUTHORIZATION, "Bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, bearer).await.0, StatusCode::OK);
    // The scheme's name is case-insensitive (RFC 9110), the token is not.
    let lower = at("/api/v1/status")
        .header(header::AUTHORIZATION, "bearer s3cret-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, lower).await.0, StatusCode::OK);
    // `?token=` sets the cookie and redirects to the address without it.
    let (status, headers, _) = send(
        &app,
        at("/?token=s3cret-token").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[header::LOCATION], "/");
    let cookie = headers[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap();
    let with_cookie = at("/api/v1/goals")
        .header(header::COOKIE, pair)
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, with_cookie).await.0, StatusCode::OK);
    let (status, _, _) = send(&app, at("/?token=nope").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[test]
fn a_non_loopback_address_needs_a_token_and_a_token_is_never_empty() {
    use loopx_serve::{ConfigError, check_config};
    let any: SocketAddr = "0.0.0.0:7878".parse().unwrap();
    let lan: SocketAddr = "192.0.2.7:7878".parse().unwrap();
    assert_eq!(
        check_config(any, None),
        Err(ConfigError::TokenRequired(any))
    );
    assert_eq!(
        check_config(lan, None),
        Err(ConfigError::TokenRequired(lan))
    );
    assert_eq!(check_config(lan, Some("")), Err(ConfigError::EmptyToken));
    assert_eq!(check_config(lan, Some(" \t")), Err(ConfigError::EmptyToken));
    assert_eq!(check_config(lan, Some("t")), Ok(()));
    // A token a browser or client could never present as it is is refused at start.
    for unusable in [
        " abc ",
        "a;b",
        "a,b",
        "a\"b",
        "a\\b",
        "pässwort",
        "a\u{7f}b",
    ] {
        assert_eq!(
            check_config(lan, Some(unusable)),
            Err(ConfigError::UnusableToken),
            "{unusable:?}"
        );
    }
    assert_eq!(
        check_config(lan, Some("Az09-._~!$%&'()*+/:<=>?@[]^`{|}")),
        Ok(())
    );
    assert_eq!(check_config("127.0.0.1:0".parse().unwrap(), None), Ok(()));
    assert_eq!(check_config("[::1]:0".parse().unwrap(), None), Ok(()));
}

#[tokio::test]
async fn the_token_redirect_stays_on_this_site_and_keeps_the_rest_of_the_query() {
    let (_dir, paths, _) = seed();
    let app = app(&paths, "0.0.0.0:7878", Some("s3cret-token"));
    for (uri, location) in [
        // A Location of `//host` or `/\host` is another site's address to a browser.
        ("//evil.example/x?token=s3cret-token", "/evil.example/x"),
        ("/\\evil.example?token=s3cret-token", "/evil.example"),
        ("/\\/\\//evil.example?token=s3cret-token", "/evil.example"),
        (
            "/api/v1/turns?goal_id=g&token=s3cret-token&status=in%20progress",
            "/api/v1/turns?goal_id=g&status=in%20progress",
        ),
        ("/?token=s3cret-token&token=s3cret-token", "/"),
        ("/a%2F%2Fb?x=%26&token=s3cret-token", "/a%2F%2Fb?x=%26"),
    ] {
        let request = Request::builder()
            .uri(uri)
            .header(header::HOST, "192.0.2.7:7878")
            .body(Body::empty())
            .unwrap();
        let (status, headers, _) = send(&app, request).await;
        assert_eq!(status, StatusCode::SEE_OTHER, "{uri}");
        assert_eq!(headers[header::LOCATION], location, "{uri}");
    }
}

#[tokio::test]
async fn an_extension_id_is_checked_and_never_read_as_a_flag() {
    let (_dir, paths, _) = seed();
    let app = app(&paths, LISTEN, None);
    for uri in [
        "/api/v1/extensions/--help",
        "/api/v1/extensions/-x",
        "/api/v1/extensions/%00",
        "/api/v1/extensions/.hidden",
    ] {
        let (status, headers, body) = send(&app, get(uri)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {body}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json", "{uri}");
        check("Error", uri, &body);
        assert!(body.contains("invalid extension id"), "{uri}: {body}");
        assert!(!body.contains("Usage"), "{uri}: {body}");
    }
}

/// The statuses the OpenAPI document gives for `path`'s GET, or none for a path it lacks.
fn documented_statuses(path: &str) -> Vec<String> {
    let doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    paths
        .iter()
        .filter(|(template, _)| route_matches(template, path))
        .flat_map(|(_, item)| {
            item["get"]["responses"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
        })
        .collect()
}

#[tokio::test]
async fn every_api_error_is_the_json_envelope_the_document_gives() {
    let (_dir, paths, _) = seed();
    let open = app(&paths, LISTEN, None);
    let guarded = app(&paths, "0.0.0.0:7878", Some("s3cret-token"));
    let request = |method: Method, uri: &str, host: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap()
    };
    let cases = [
        (
            &open,
            request(Method::GET, "/api/v1/nope", LISTEN),
            404,
            "not_found",
        ),
        (
            &open,
            request(Method::GET, "/api/v1/goals/%FF", LISTEN),
            400,
            "bad_input",
        ),
        (
            &open,
            request(
                Method::GET,
                "/api/v1/goals/g/history?limit=1&limit=2",
                LISTEN,
            ),
            400,
            "bad_input",
        ),
        (
            &open,
            request(Method::POST, "/api/v1/status", LISTEN),
            405,
            "bad_input",
        ),
        (
            &open,
            request(Method::GET, "/api/v1/status", "evil.example:7878"),
            421,
            "refused",
        ),
        (
            &guarded,
            request(Method::GET, "/api/v1/goals", "192.0.2.7:7878"),
            401,
            "refused",
        ),
    ];
    for (app, request, status, kind) in cases {
        let uri = request.uri().clone();
        let (got, headers, body) = send(app, request).await;
        assert_eq!(got.as_u16(), status, "{uri}: {body}");
        assert_eq!(headers[header::CONTENT_TYPE], "application/json", "{uri}");
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY
        );
        check("Error", &uri.to_string(), &body);
        let value: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["error"]["kind"], kind, "{uri}: {body}");
        assert!(
            value["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
        // The router's own headers stay: what to send instead.
        match status {
            405 => assert!(headers.contains_key(header::ALLOW), "{uri}"),
            401 => assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer"),
            _ => {}
        }
        let documented = documented_statuses(uri.path());
        assert!(
            uri.path() == "/api/v1/nope" || documented.contains(&status.to_string()),
            "{uri}: {status} is not in the document's {documented:?}"
        );
    }
    // Every route documents the refusals and the other methods' answer.
    let doc: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    for (path, _) in doc["paths"].as_object().unwrap() {
        let documented = documented_statuses(path);
        for status in ["401", "405", "421"] {
            assert!(documented.iter().any(|s| s == status), "{path}: {status}");
        }
    }
    // A page is no API: its 404 stays text.
    let (status, headers, _) = send(&open, get("/nothing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(
        headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
}
