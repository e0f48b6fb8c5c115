//! LoopX's read-only web dashboard: the JSON API, the event stream and the page.
//!
//! An operator leaves the page open all day, so three things shape this crate. It never writes:
//! every API route is a GET that runs one of the CLI's read-only commands in-process
//! (`loopx::cli::serve::api_read`, one kernel per request, read snapshots only), and no other
//! method is routed. It is live without polling: one thread sleeps in the kernel's
//! [`ChangeWatcher`] and wakes every open page through a broadcast channel and Server-Sent
//! Events. And it is safe to leave open: loopback by default, a token for anything else, the
//! `Host` header checked against the listen address (DNS rebinding), a strict
//! Content-Security-Policy, and every value from the store put on the page as text.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use loopx::cli::serve::{api_read, error_json, run_report};
use loopx::error::{LoopxError, bad_input, refused};
use loopx::kernel::SchemaUpgrade;
use loopx::kernel::watch::ChangeWatcher;
use loopx::paths::ProjectPaths;
use loopx::plugin::manifest::is_extension_id;
use serde::Deserialize;
use tokio::sync::broadcast;

mod connections;
pub use connections::{
    HEADER_READ_TIMEOUT, MAX_CONNECTIONS, SHUTDOWN_GRACE, WRITE_STALL_TIMEOUT, serve_until,
};

/// The page, its script and its style, compiled in: no build step, nothing fetched at run time.
const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");
/// The API's OpenAPI 3.1 document, written by hand; `tests/api.rs` validates every route's
/// responses against it.
pub const OPENAPI_JSON: &str = include_str!("../assets/openapi.json");

/// The policy every response carries: only this origin's own script, style and connections; no
/// inline script, no plugins, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The cookie `?token=` sets, so the page's own requests (and its event stream, which cannot
/// send headers) carry the token.
pub const TOKEN_COOKIE: &str = "loopx_token";

/// What the server was started with.
#[derive(Debug, Clone)]
pub struct Config {
    pub paths: ProjectPaths,
    /// The address the listener is bound to (after the OS picked a port for `:0`).
    pub listen: SocketAddr,
    pub token: Option<String>,
}

/// Why a configuration cannot be served; `loopx-serve` exits 2 with it.
#[derive(Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// A non-loopback address without a token.
    TokenRequired(SocketAddr),
    /// An empty token (or token file).
    EmptyToken,
    /// A token with a character that cannot travel in an `Authorization` header and a cookie as
    /// it is (a space, a quote, `,`, `;`, `\\`, a control or non-ASCII character): accepted, it
    /// could never be presented.
    UnusableToken,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::TokenRequired(addr) => write!(
                f,
                "refusing to listen on {addr} without a token: anyone who can reach that \
                 address could read the project. Pass --token-file FILE (or --token TOKEN), or \
                 listen on loopback (--listen 127.0.0.1:PORT)"
            ),
            ConfigError::EmptyToken => write!(
                f,
                "the token is empty; put a long random token in the file (for example `openssl \
                 rand -hex 32 > token`) or pass a non-empty --token"
            ),
            ConfigError::UnusableToken => write!(
                f,
                "the token has a character a browser cannot send back as it is (a space, a \
                 quote, a comma, a semicolon, a backslash, or one outside printable ASCII); use \
                 letters, digits and punctuation only (for example `openssl rand -hex 32 > token`)"
            ),
        }
    }
}

/// Checks that `listen` may be served with `token`.
pub fn check_config(listen: SocketAddr, token: Option<&str>) -> Result<(), ConfigError> {
    let presentable = |t: &str| {
        t.bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b',' | b';' | b'\\'))
    };
    match token {
        Some(t) if t.trim().is_empty() => Err(ConfigError::EmptyToken),
        Some(t) if !presentable(t) => Err(ConfigError::UnusableToken),
        None if !listen.ip().is_loopback() => Err(ConfigError::TokenRequired(listen)),
        _ => Ok(()),
    }
}

struct AppState {
    config: Config,
    changes: broadcast::Sender<u64>,
    /// One permit per open event stream, at most [`MAX_EVENT_STREAMS`].
    streams: Arc<tokio::sync::Semaphore>,
}

/// The most event streams open at once. An open page holds one for as long as it is open, so
/// without a bound of their own the streams alone could take every connection
/// ([`MAX_CONNECTIONS`]) and leave none for the operator's requests; past it a stream is
/// refused with 503, and the page tries again a few seconds later.
pub const MAX_EVENT_STREAMS: usize = 64;

type Shared = Arc<AppState>;

/// The dashboard's routes, behind the host, token and header checks. `changes` carries one
/// message per commit noticed (see [`watch_changes`]).
pub fn router(config: Config, changes: broadcast::Sender<u64>) -> Router {
    let state = Arc::new(AppState {
        config,
        changes,
        streams: Arc::new(tokio::sync::Semaphore::new(MAX_EVENT_STREAMS)),
    });
    Router::new()
        .route("/", get(index))
        .route("/app.js", get(app_js))
        .route("/app.css", get(app_css))
        .route("/api/v1/openapi.json", get(openapi))
        .route("/api/v1/events", get(events))
        .route("/api/v1/status", get(status))
        .route("/api/v1/goals", get(goal_list))
        .route("/api/v1/goals/{goal}", get(goal_show))
        .route("/api/v1/goals/{goal}/todos", get(todo_list))
        .route("/api/v1/goals/{goal}/todos/{todo}", get(todo_show))
        .route("/api/v1/goals/{goal}/gates", get(gate_list))
        .route("/api/v1/goals/{goal}/quota", get(quota_show))
        .route("/api/v1/goals/{goal}/should-run", get(should_run))
        .route("/api/v1/goals/{goal}/summary", get(summary))
        .route("/api/v1/goals/{goal}/history", get(history))
        .route("/api/v1/goals/{goal}/runs/{run}", get(run_show))
        .route("/api/v1/turns", get(turn_list))
        .route("/api/v1/turns/{turn}", get(turn_show))
        .route("/api/v1/extensions", get(extension_list))
        .route("/api/v1/extensions/{id}", get(extension_show))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// Sleeps in a [`ChangeWatcher`] (call it on a thread of its own) and sends one message per
/// commit noticed, for the life of the process. When the watcher fails (the database at the path
/// was replaced by a file it cannot read: not a database, an older schema the server will not
/// upgrade), `on_error` hears why, pages are told to fetch again (and show that error), and a new
/// watcher is tried every [`WATCH_RETRY`] until one starts, which tells the pages once more.
pub fn watch_changes(
    paths: &ProjectPaths,
    changes: broadcast::Sender<u64>,
    mut on_error: impl FnMut(&LoopxError),
) -> ! {
    let mut seq = 0u64;
    // No receiver (no page open) is not an error: the next page fetches fresh state.
    let mut notify = || {
        seq += 1;
        let _ = changes.send(seq);
    };
    let mut failing = false;
    loop {
        let failure = match ChangeWatcher::new(paths, SchemaUpgrade::Refuse) {
            Ok(mut watcher) => {
                if std::mem::take(&mut failing) {
                    notify();
                }
                loop {
                    match watcher.wait(None) {
                        Ok(true) => notify(),
                        Ok(false) => {}
                        Err(e) => break e,
                    }
                }
            }
            Err(e) => e,
        };
        if !failing {
            on_error(&failure);
            notify();
            failing = true;
        }
        std::thread::sleep(WATCH_RETRY);
    }
}

/// How often a failed change watcher is started again.
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Refuses requests for another host (DNS rebinding) or without the token, answers every API
/// error as the JSON envelope, and puts the security headers on every response, refusals
/// included.
async fn guard(State(state): State<Shared>, request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let mut response = match refusal(&state.config, &request) {
        // The connection closes after a refusal: a client without the token (or for another
        // host) gets one answer per connection, not a kept-alive slot to pipeline into.
        Some(mut refused) => {
            refused
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            refused
        }
        None => next.run(request).await,
    };
    if api {
        response = as_envelope(response).await;
    }
    secure_headers(response.headers_mut());
    response
}

/// The longest error text [`as_envelope`] reads: the router's and the extractors' texts are a
/// sentence, and a body longer than this is no error text of theirs.
const ERROR_TEXT_LIMIT: usize = 16 * 1024;

/// An API error that is not the JSON envelope yet (a refusal, the router's 404 and 405, an
/// extractor's rejection) becomes one, with its text as the message and its status and headers
/// kept: a script (and the OpenAPI document) reads every API error in one shape.
async fn as_envelope(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, ERROR_TEXT_LIMIT)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    let err = error_of(status, text);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(error_json(&err)))
}

/// The kind of failure an HTTP error status reports, with `text` (or, for the router's answers
/// that have none, a sentence of our own) as its message.
fn error_of(status: StatusCode, text: String) -> LoopxError {
    let text = match (text.is_empty(), status) {
        (false, _) => text,
        (true, StatusCode::METHOD_NOT_ALLOWED) => {
            "the dashboard's API only reads: use GET (or HEAD)".to_string()
        }
        (true, _) => format!("the request failed: {status}"),
    };
    match status {
        StatusCode::NOT_FOUND => loopx::error::not_found(text),
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::MISDIRECTED_REQUEST => {
            refused(text)
        }
        // The kind [`error_status`] answers with 503: the server cannot serve it now.
        StatusCode::SERVICE_UNAVAILABLE => LoopxError::Io {
            path: std::path::PathBuf::new(),
            context: text,
            source: std::io::Error::from(std::io::ErrorKind::ResourceBusy),
        },
        s if s.is_server_error() => {
            LoopxError::internal(text, std::io::Error::other(s.to_string()))
        }
        _ => bad_input(text),
    }
}

/// The answer to a request that may not go on: another host, or a missing or wrong token (or
/// the redirect that moves a `?token=` into a cookie).
fn refusal(config: &Config, request: &Request) -> Option<Response> {
    let target_ok = request
        .uri()
        .authority()
        .is_none_or(|a| authority_allowed(config.listen, a.as_str()));
    if !host_allowed(config.listen, request.headers()) || !target_ok {
        return Some(
            (
                StatusCode::MISDIRECTED_REQUEST,
                "this server answers only for the address it listens on (Host header refused)\n",
            )
                .into_response(),
        );
    }
    let token = config.token.as_deref()?;
    if let Some(given) = query_token(request.uri().query()) {
        if !same_secret(given.as_bytes(), token.as_bytes()) {
            return Some(unauthorized());
        }
        // The token moves from the address into a cookie, and out of the address bar.
        let mut response = (
            StatusCode::SEE_OTHER,
            [(header::LOCATION, without_token(request.uri()))],
        )
            .into_response();
        let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict");
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().insert(header::SET_COOKIE, value);
        }
        return Some(response);
    }
    match request_token(request.headers()) {
        Some(t) if same_secret(t.as_bytes(), token.as_bytes()) => None,
        _ => Some(unauthorized()),
    }
}

/// Where the `?token=` redirect sends the browser: the same path and query, without `token`.
/// The path keeps exactly one leading `/`: a `Location` of `//evil.example/x` or `/\evil.example`
/// is another site's address to a browser. The rest is copied as the request spelled it, so its
/// percent-encoding stays as it was.
fn without_token(uri: &Uri) -> String {
    let path = uri.path().trim_start_matches(['/', '\\']);
    let kept: Vec<&str> = uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty() && pair.split('=').next() != Some("token"))
        .collect();
    if kept.is_empty() {
        format!("/{path}")
    } else {
        format!("/{path}?{}", kept.join("&"))
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "this dashboard needs its token: open it once as /?token=TOKEN, or send \
         `Authorization: Bearer TOKEN`\n",
    )
        .into_response()
}

/// Whether the `Host` header names this server: `localhost` or an IP address it listens on,
/// with its port. A DNS rebinding attack reaches the server under the attacker's host name,
/// which is refused; an IP literal cannot be rebound.
/// Exactly one `Host` header is accepted (RFC 9112 makes two a bad request), and a request
/// target in absolute form (`GET http://name/...`) must name an allowed host too: a proxy or a
/// client may go by either.
pub fn host_allowed(listen: SocketAddr, headers: &HeaderMap) -> bool {
    let mut hosts = headers.get_all(header::HOST).iter();
    match (hosts.next(), hosts.next()) {
        (Some(host), None) => host
            .to_str()
            .is_ok_and(|host| authority_allowed(listen, host)),
        _ => false,
    }
}

/// Whether `host` (`name[:port]`, `[v6][:port]`) names this server, spelled strictly: brackets
/// only around an IPv6 address, a port of plain digits without a leading zero.
pub fn authority_allowed(listen: SocketAddr, host: &str) -> bool {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((v6, "")) => (v6, None),
            Some((v6, tail)) => match tail.strip_prefix(':') {
                Some(port) => (v6, Some(port)),
                None => return false,
            },
            None => return false,
        },
        None => match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    let bracketed = host.starts_with('[');
    if name.is_empty() || name.contains(['[', ']']) || (!bracketed && name.contains(':')) {
        return false;
    }
    let port_ok = match port {
        Some(p) => {
            p.bytes().all(|b| b.is_ascii_digit())
                && !(p.len() > 1 && p.starts_with('0'))
                && p.parse::<u16>() == Ok(listen.port())
        }
        None => listen.port() == 80,
    };
    if !port_ok {
        return false;
    }
    if !bracketed && name.eq_ignore_ascii_case("localhost") {
        return listen.ip().is_loopback() || listen.ip().is_unspecified();
    }
    let ip = if bracketed {
        name.parse::<std::net::Ipv6Addr>().map(IpAddr::V6)
    } else {
        name.parse::<std::net::Ipv4Addr>().map(IpAddr::V4)
    };
    match ip {
        Ok(ip) if listen.ip().is_unspecified() => !ip.is_unspecified(),
        Ok(ip) if listen.ip().is_loopback() => ip.is_loopback(),
        Ok(ip) => ip == listen.ip(),
        Err(_) => false,
    }
}

fn query_token(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| percent_decode(v))
}

fn request_token(headers: &HeaderMap) -> Option<String> {
    if let Some(auth) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .and_then(|(scheme, token)| scheme.eq_ignore_ascii_case("bearer").then_some(token))
    {
        return Some(auth.trim().to_string());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == TOKEN_COOKIE)
        .map(|(_, v)| v.to_string())
}

/// Compares two secrets in time that depends on their lengths only.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match bytes[i] {
            b'%' if i + 2 < bytes.len() => hex(bytes[i + 1]).zip(hex(bytes[i + 2])),
            _ => None,
        };
        match (decoded, bytes[i]) {
            (Some((hi, lo)), _) => {
                out.push(hi << 4 | lo);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn secure_headers(headers: &mut HeaderMap) {
    let fixed = [
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in fixed {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

async fn app_js() -> Response {
    static SCRIPT: LazyLock<String> = LazyLock::new(|| format!("{}{APP_JS}", hidden_characters()));
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        SCRIPT.as_str(),
    )
        .into_response()
}

/// The script's first line: the characters `loopx::inert` shows as escapes (controls, bidi,
/// invisible), as a regular expression built from [`loopx::inert::is_hidden`] itself, so the page
/// and the CLI hide the same set and there is one list to keep.
pub fn hidden_characters() -> String {
    let mut class = String::new();
    let mut run: Option<(u32, u32)> = None;
    let flush = |(lo, hi): (u32, u32), class: &mut String| {
        class.push_str(&format!("\\u{{{lo:x}}}"));
        if hi > lo {
            class.push_str(&format!("-\\u{{{hi:x}}}"));
        }
    };
    for c in (0..=char::MAX as u32).filter_map(char::from_u32) {
        let cp = c as u32;
        if !loopx::inert::is_hidden(c) {
            continue;
        }
        run = match run {
            Some((lo, hi)) if hi + 1 == cp => Some((lo, cp)),
            Some(done) => {
                flush(done, &mut class);
                Some((cp, cp))
            }
            None => Some((cp, cp)),
        };
    }
    if let Some(done) = run {
        flush(done, &mut class);
    }
    format!("const HIDDEN = /[{class}]/gu;\n")
}

async fn app_css() -> Response {
    asset(APP_CSS, "text/css; charset=utf-8")
}

async fn openapi() -> Response {
    asset(OPENAPI_JSON, "application/json")
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "no such page or API route\n").into_response()
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Runs one read-only CLI command on a blocking thread and answers with what it prints.
async fn read(state: Shared, args: Vec<String>) -> Response {
    let paths = state.config.paths.clone();
    let result = tokio::task::spawn_blocking(move || api_read(&paths, &args)).await;
    json_answer(result)
}

fn json_answer(result: Result<loopx::error::Result<String>, tokio::task::JoinError>) -> Response {
    match result {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(err)) => error_answer(&err),
        Err(join) => error_answer(&LoopxError::internal("the request's worker stopped", join)),
    }
}

/// The JSON envelope of `err`, with its status.
fn error_answer(err: &LoopxError) -> Response {
    (
        error_status(err),
        [(header::CONTENT_TYPE, "application/json")],
        error_json(err),
    )
        .into_response()
}

/// The HTTP status of each kind of failure.
pub fn error_status(err: &LoopxError) -> StatusCode {
    match err {
        LoopxError::BadInput(_) => StatusCode::BAD_REQUEST,
        LoopxError::NotFound(_) => StatusCode::NOT_FOUND,
        LoopxError::Refused(_) => StatusCode::FORBIDDEN,
        LoopxError::Conflict(_) => StatusCode::CONFLICT,
        LoopxError::Io { .. } => StatusCode::SERVICE_UNAVAILABLE,
        LoopxError::Corrupt { .. } | LoopxError::Internal { .. } => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

/// `--name=value`: a value that starts with `-` stays a value.
fn flag(name: &str, value: &str) -> String {
    format!("--{name}={value}")
}

fn argv(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

#[derive(Deserialize)]
struct AgentQuery {
    agent_id: Option<String>,
}

#[derive(Deserialize)]
struct PageQuery {
    limit: Option<String>,
    before: Option<String>,
}

#[derive(Deserialize)]
struct TurnQuery {
    goal_id: Option<String>,
    status: Option<String>,
    limit: Option<String>,
}

async fn status(State(s): State<Shared>) -> Response {
    read(s, argv(&["status"])).await
}

async fn goal_list(State(s): State<Shared>) -> Response {
    read(s, argv(&["goal", "list"])).await
}

async fn goal_show(State(s): State<Shared>, Path(goal): Path<String>) -> Response {
    read(
        s,
        vec!["goal".into(), "show".into(), flag("goal-id", &goal)],
    )
    .await
}

async fn todo_list(State(s): State<Shared>, Path(goal): Path<String>) -> Response {
    read(
        s,
        vec!["todo".into(), "list".into(), flag("goal-id", &goal)],
    )
    .await
}

async fn todo_show(
    State(s): State<Shared>,
    Path((goal, todo)): Path<(String, String)>,
) -> Response {
    let args = vec![
        "todo".into(),
        "show".into(),
        flag("goal-id", &goal),
        flag("todo-id", &todo),
    ];
    read(s, args).await
}

async fn gate_list(State(s): State<Shared>, Path(goal): Path<String>) -> Response {
    read(
        s,
        vec!["gate".into(), "list".into(), flag("goal-id", &goal)],
    )
    .await
}

async fn quota_show(
    State(s): State<Shared>,
    Path(goal): Path<String>,
    Query(q): Query<AgentQuery>,
) -> Response {
    let mut args = vec!["quota".into(), "show".into(), flag("goal-id", &goal)];
    args.extend(q.agent_id.map(|a| flag("agent-id", &a)));
    read(s, args).await
}

async fn should_run(
    State(s): State<Shared>,
    Path(goal): Path<String>,
    Query(q): Query<AgentQuery>,
) -> Response {
    let mut args = vec!["quota".into(), "should-run".into(), flag("goal-id", &goal)];
    args.extend(q.agent_id.map(|a| flag("agent-id", &a)));
    read(s, args).await
}

async fn summary(State(s): State<Shared>, Path(goal): Path<String>) -> Response {
    read(s, vec!["summary_all".into(), flag("goal-id", &goal)]).await
}

async fn history(
    State(s): State<Shared>,
    Path(goal): Path<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let mut args = vec!["history".into(), flag("goal-id", &goal)];
    args.extend(q.limit.map(|l| flag("limit", &l)));
    args.extend(q.before.map(|b| flag("before", &b)));
    read(s, args).await
}

async fn run_show(State(s): State<Shared>, Path((goal, run)): Path<(String, String)>) -> Response {
    let paths = s.config.paths.clone();
    let result = tokio::task::spawn_blocking(move || run_report(&paths, &goal, &run)).await;
    json_answer(result)
}

async fn turn_list(State(s): State<Shared>, Query(q): Query<TurnQuery>) -> Response {
    let mut args = vec!["turn".into(), "list".into()];
    args.extend(q.goal_id.map(|g| flag("goal-id", &g)));
    args.extend(q.status.map(|g| flag("status", &g)));
    args.extend(q.limit.map(|g| flag("limit", &g)));
    read(s, args).await
}

async fn turn_show(State(s): State<Shared>, Path(turn): Path<String>) -> Response {
    read(
        s,
        vec!["turn".into(), "inspect".into(), flag("turn-key", &turn)],
    )
    .await
}

async fn extension_list(State(s): State<Shared>) -> Response {
    read(s, argv(&["extension", "list"])).await
}

/// The id is the CLI's positional argument, not a `--flag=value`: it is checked as a manifest's
/// name is, so an id no extension can have is a 400 like every other id's, and it comes after
/// `--`, so even a check that let `--help` through would not make it a flag.
async fn extension_show(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    if !is_extension_id(&id) {
        return error_answer(&bad_input(format!(
            "invalid extension id '{id}': use letters, digits, '.', '_' or '-', starting with a \
             letter or digit, as `extension list` shows it"
        )));
    }
    read(
        s,
        vec!["extension".into(), "inspect".into(), "--".into(), id],
    )
    .await
}

/// One `change` event per commit noticed, after a `ready` event; a page that missed events
/// (it lagged, or reconnected) re-fetches everything it shows, so none carries data.
async fn events(State(s): State<Shared>) -> Response {
    let Ok(permit) = s.streams.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "5")],
            format!(
                "{MAX_EVENT_STREAMS} event streams are open, the most this server keeps; close a \
                 dashboard tab, or wait: the page tries again by itself\n"
            ),
        )
            .into_response();
    };
    let receiver = s.changes.subscribe();
    let ready = futures_util::stream::once(async {
        Ok::<_, std::convert::Infallible>(Event::default().event("ready").data("{}"))
    });
    // The permit lives in the stream's state: it is given back when the stream is dropped.
    let changes = futures_util::stream::unfold((receiver, permit), |(mut rx, permit)| async move {
        // A page that lagged behind gets one change without a number: it re-fetches anyway.
        let seq = match rx.recv().await {
            Ok(seq) => seq.to_string(),
            Err(broadcast::error::RecvError::Lagged(_)) => "null".to_string(),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        let event = Event::default()
            .event("change")
            .data(format!("{{\"seq\":{seq}}}"));
        Some((Ok(event), (rx, permit)))
    });
    use futures_util::StreamExt;
    Sse::new(ready.chain(changes))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// The most of `--token-file` read: a token is one short line, and the file may be a pipe
/// (`<(pass show ...)`), so it is bounded by bytes rather than checked as a regular file.
const TOKEN_FILE_LIMIT: u64 = 4096;

/// Reads the token given by `--token` or the first line of `--token-file`.
pub fn load_token(token: Option<String>, file: Option<PathBuf>) -> std::io::Result<Option<String>> {
    use std::io::Read;
    match (token, file) {
        (Some(t), _) => Ok(Some(t)),
        (None, Some(f)) => {
            let mut bytes = Vec::new();
            std::fs::File::open(&f)?
                .take(TOKEN_FILE_LIMIT + 1)
                .read_to_end(&mut bytes)?;
            let first = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
            if bytes.len() as u64 > TOKEN_FILE_LIMIT && first.len() == bytes.len() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: no line break in its first {TOKEN_FILE_LIMIT} bytes: a token is one short line",
                        f.display()
                    ),
                ));
            }
            let line = std::str::from_utf8(first).map_err(|_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: the token's line is not UTF-8 text", f.display()),
                )
            })?;
            Ok(Some(line.trim().to_string()))
        }
        (None, None) => Ok(None),
    }
}
