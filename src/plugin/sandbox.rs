//! Running one call of one component in a fresh, limited store.
//!
//! Why this exists: it is the single choke point every guest execution goes through (CLI, turn
//! driver, benchmarks, tests, and capability→provider calls alike), so every limit is applied in one
//! place: a new `Store` per call (a store never frees instances), fuel, an epoch deadline, memory /
//! table / instance limits with `trap_on_grow_failure`, hostcall fuel capping bytes lifted from the
//! guest, captured size-capped logs, and a WASI context built from the grants and nothing else.
//! After the call, outputs are checked against the kernel's size limits before anyone sees them, and
//! a failed call yields no partial output.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde::Serialize;
use wasmtime::component::{Component, HasData, HasSelf, Linker, Resource, ResourceTable};
use wasmtime::{Engine, Store, StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::clocks::WasiClocksCtxView;
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::clocks::monotonic_clock;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::kernel::transition::{MAX_PROPOSAL_TEXT, MAX_PROPOSALS_PER_CALL, Transition};

use super::audit::audit_imports;
use super::bindings::{self, cap, prov, wit};
use super::engine::{MAX_WASM_STACK, deadline_ticks};
use super::error::{CallLimits, PluginError, PluginResult, classify};
use super::logs::{LogBuffer, LogLine};
use super::manifest::{Grant, Kind, Limits, Permission};
use super::types::{CapabilityInput, Observation, ObserveRequest, PluginInfo, ProviderCall};

/// Largest payload the host sends to a capability.
pub const MAX_PAYLOAD_BYTES: usize = 1 << 20;
/// Most `depends_on` entries in one proposal.
pub const MAX_DEPENDS_ON: usize = 64;
/// Most facts in one observation.
pub const MAX_FACTS: usize = 1000;
/// Longest observation summary / fact value / kind.
pub const MAX_OBSERVATION_TEXT: usize = 8 * 1024;

/// Store data for every call.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    /// When the call's wall-clock deadline passes; clock waits are cut short here.
    deadline: Instant,
    /// Set when the guest asked for a clock wait that would outlast the deadline.
    wait_cut: bool,
    limits: StoreLimits,
    plugin: String,
    logs: LogBuffer,
    broker: Option<Broker>,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl wit::Host for HostState {}

fn level_name(level: wit::LogLevel) -> &'static str {
    match level {
        wit::LogLevel::Trace => "trace",
        wit::LogLevel::Debug => "debug",
        wit::LogLevel::Info => "info",
        wit::LogLevel::Warn => "warn",
        wit::LogLevel::Error => "error",
    }
}

impl cap::loopx::plugin::host::Host for HostState {
    fn call_provider(
        &mut self,
        provider_id: String,
        request: wit::ObserveRequest,
    ) -> Result<wit::Observation, wit::PluginError> {
        let logs = self.logs.clone();
        let deadline = self.deadline;
        match self.broker.as_mut() {
            Some(b) => b.call(
                &provider_id,
                bindings::request_from_wit(request),
                &logs,
                deadline,
            ),
            None => Err(wit::PluginError::Denied(
                "this plugin may not call providers".into(),
            )),
        }
    }

    fn log(&mut self, level: wit::LogLevel, message: String) {
        self.logs.line(&self.plugin, level_name(level), &message);
    }
}

impl prov::loopx::plugin::logging::Host for HostState {
    fn log(&mut self, level: wit::LogLevel, message: String) {
        self.logs.line(&self.plugin, level_name(level), &message);
    }
}

/// Mediates a capability's provider calls: declared in `uses`, within budget, loaded and enabled.
pub(crate) struct Broker {
    capability: String,
    declared: Vec<String>,
    providers: HashMap<String, Arc<LoadedPlugin>>,
    max_calls: u32,
    used: u32,
    /// The capability's own `deadline_ms`, named when a provider call runs past it.
    deadline_ms: u64,
    calls: Vec<ProviderCall>,
    /// The first host-contract violation; it fails the whole capability call afterwards.
    violation: Option<PluginError>,
}

impl Broker {
    /// One provider call on behalf of the capability whose call ends at `deadline`. The provider
    /// runs under the earlier of its own deadline and the capability's, so a provider call never
    /// outlives its caller; a provider blocked where its own deadline cannot reach it (a blocking
    /// read in a host call) is abandoned when the capability's time is up.
    fn call(
        &mut self,
        id: &str,
        request: ObserveRequest,
        logs: &LogBuffer,
        deadline: Instant,
    ) -> Result<wit::Observation, wit::PluginError> {
        let record = |outcome: &str, detail: String| ProviderCall {
            provider: id.to_string(),
            operation: request.operation.clone(),
            target: request.target.clone(),
            outcome: outcome.to_string(),
            detail,
        };
        if !self.declared.iter().any(|d| d == id) {
            let err = PluginError::NotDeclared {
                plugin: self.capability.clone(),
                provider: id.to_string(),
            };
            let msg = err.to_string();
            self.calls.push(record(err.kind().as_str(), msg.clone()));
            self.violation.get_or_insert(err);
            return Err(wit::PluginError::Denied(msg));
        }
        if self.used >= self.max_calls {
            let err = PluginError::CallBudget {
                plugin: self.capability.clone(),
                limit: self.max_calls,
            };
            let msg = err.to_string();
            self.calls.push(record(err.kind().as_str(), msg.clone()));
            self.violation.get_or_insert(err);
            return Err(wit::PluginError::Denied(msg));
        }
        self.used += 1;
        let Some(provider) = self.providers.get(id).cloned() else {
            let msg = format!("provider {id} is not installed or is disabled");
            self.calls.push(record("unavailable", msg.clone()));
            return Err(wit::PluginError::Unavailable(msg));
        };
        if Instant::now() >= deadline {
            return Err(self.out_of_time(record("deadline", String::new())));
        }
        // Nested call: its log lines stay in the capability's buffer (`drain = false`).
        let Some((result, _)) = run_bounded(&provider, &request, logs, false, Some(deadline))
        else {
            return Err(self.out_of_time(record("deadline", String::new())));
        };
        if Instant::now() >= deadline {
            // The provider used up the capability's time (its own deadline was cut to it): the
            // capability's call has failed, whatever the provider returned.
            let detail = match &result {
                Ok(_) => "returned after the capability's deadline".to_string(),
                Err(e) => e.to_string(),
            };
            return Err(self.out_of_time(record("deadline", detail)));
        }
        match result {
            Ok(obs) => {
                self.calls.push(record("ok", obs.summary.clone()));
                Ok(bindings::observation_to_wit(&obs))
            }
            Err(e) => {
                let msg = e.to_string();
                self.calls.push(record(e.kind().as_str(), msg.clone()));
                Err(wit::PluginError::Failed(msg))
            }
        }
    }

    /// Records a provider call that ran out of the capability's time and fails the whole
    /// capability call with `Deadline` (the guest only sees `failed`).
    fn out_of_time(&mut self, mut call: ProviderCall) -> wit::PluginError {
        let err = PluginError::Deadline {
            plugin: self.capability.clone(),
            limit_ms: self.deadline_ms,
        };
        if call.detail.is_empty() {
            call.detail = err.to_string();
        }
        let msg = format!("{} (provider {})", err, call.provider);
        self.calls.push(call);
        self.violation.get_or_insert(err);
        wit::PluginError::Failed(msg)
    }
}

/// Slack allowed past a deadline for a call stuck in a blocking host call before the caller stops
/// waiting for it: the epoch check that normally ends a call lands within two 10 ms ticks, so a
/// call still running 50 ms after its deadline is blocked where no epoch check can reach it.
pub const DEADLINE_SLACK_MS: u64 = 50;

/// Runs a provider's `observe` on its own thread and waits at most until `deadline` (the caller's;
/// without one, the provider's own) plus [`DEADLINE_SLACK_MS`]. `None` when it did not finish by
/// then: the thread is abandoned, still blocked in its host call (a read of a FIFO, say), and the
/// caller goes on. Nothing it produces afterwards is used; it holds its instance until the host
/// call returns or the process exits. Epoch interruption cannot end such a call because no wasm is
/// running, and a thread cannot be killed, so abandoning it is the only bound there is.
fn run_bounded(
    provider: &Arc<LoadedPlugin>,
    request: &ObserveRequest,
    logs: &LogBuffer,
    drain: bool,
    deadline: Option<Instant>,
) -> Option<(PluginResult<Observation>, CallReport)> {
    let started = Instant::now();
    let own = started + Duration::from_millis(provider.limits.deadline_ms);
    let until = deadline.map_or(own, |d| d.min(own)) + Duration::from_millis(DEADLINE_SLACK_MS);
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let (p, req, l) = (Arc::clone(provider), request.clone(), logs.clone());
    let spawned = std::thread::Builder::new()
        .name("loopx-provider-call".into())
        .spawn(move || {
            let _ = tx.send(p.run_observe(&req, &l, drain, deadline));
        });
    if spawned.is_err() {
        // No thread to spare: run inline, bounded by the epoch and clock deadlines only.
        return Some(provider.run_observe(request, logs, drain, deadline));
    }
    rx.recv_timeout(until.saturating_duration_since(Instant::now()))
        .ok()
}

enum Pre {
    Capability(cap::CapabilityPre<HostState>),
    Provider(prov::ProviderPre<HostState>),
}

/// A component ready to run: imports audited, linked, type-checked (`InstancePre`).
pub struct LoadedPlugin {
    /// `<extension>/<id>`.
    pub label: String,
    pub kind: Kind,
    pub limits: Limits,
    /// Providers a capability may call.
    pub uses: Vec<String>,
    /// The component's import names, as audited.
    pub imports: Vec<String>,
    /// The installed extension revision it was loaded from (`None` for a component loaded
    /// outside the registry).
    pub revision: Option<i64>,
    grants: Vec<Grant>,
    engine: Engine,
    pre: Pre,
}

/// Measurements and side output of one call, returned whether or not it succeeded.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CallReport {
    pub plugin: String,
    pub fuel_consumed: Option<u64>,
    pub elapsed_us: u64,
    pub logs: Vec<LogLine>,
    pub provider_calls: Vec<ProviderCall>,
}

fn linker(engine: &Engine, kind: Kind) -> PluginResult<Linker<HostState>> {
    let mut linker = Linker::<HostState>::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| PluginError::host("linking WASI", e))?;
    linker.allow_shadowing(true);
    monotonic_clock::add_to_linker::<_, DeadlineClock>(&mut linker, |s| DeadlineClockView {
        deadline: s.deadline,
        wait_cut: &mut s.wait_cut,
        clocks: WasiClocksCtxView {
            ctx: s.wasi.clocks(),
            table: &mut s.table,
        },
    })
    .map_err(|e| PluginError::host("linking the deadline clock", e))?;
    linker.allow_shadowing(false);
    match kind {
        Kind::Capability => cap::Capability::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s),
        Kind::Provider => prov::Provider::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s),
    }
    .map_err(|e| PluginError::host("linking loopx:plugin", e))?;
    Ok(linker)
}

/// Linkers are built once per kind per process (they only depend on the engine).
fn shared_linker(engine: &Engine, kind: Kind) -> PluginResult<&'static Linker<HostState>> {
    static CAP: OnceLock<Linker<HostState>> = OnceLock::new();
    static PROV: OnceLock<Linker<HostState>> = OnceLock::new();
    let cell = match kind {
        Kind::Capability => &CAP,
        Kind::Provider => &PROV,
    };
    if let Some(l) = cell.get() {
        return Ok(l);
    }
    let l = linker(engine, kind)?;
    Ok(cell.get_or_init(|| l))
}

/// `wasi:clocks/monotonic-clock` with every wait cut short at the call's deadline. The epoch
/// deadline only stops running wasm: a guest blocked in a host call (`thread::sleep`, a `poll` on a
/// clock) would otherwise hold the host for as long as it asked. Once the wait returns, the next
/// epoch check in the guest traps with `Deadline`, and a call that had a wait cut and returns
/// after its deadline anyway (before any epoch check) fails with `Deadline` too ([`deadline_held`]).
/// The clock's readings are WASI's own (frozen for capabilities); only the waits change.
struct DeadlineClock;

impl HasData for DeadlineClock {
    type Data<'a> = DeadlineClockView<'a>;
}

struct DeadlineClockView<'a> {
    deadline: Instant,
    wait_cut: &'a mut bool,
    clocks: WasiClocksCtxView<'a>,
}

impl DeadlineClockView<'_> {
    fn capped(&mut self, nanos: u64) -> u64 {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let left = u64::try_from(left.as_nanos()).unwrap_or(u64::MAX);
        if nanos > left {
            *self.wait_cut = true;
        }
        nanos.min(left)
    }
}

/// Fails a call that returned after its deadline with a clock wait cut short: the guest may have
/// reached its return before any epoch check noticed the time.
fn deadline_held<R>(store: &Store<HostState>, raw: wasmtime::Result<R>) -> wasmtime::Result<R> {
    let state = store.data();
    if raw.is_ok() && state.wait_cut && Instant::now() >= state.deadline {
        return Err(wasmtime::Trap::Interrupt.into());
    }
    raw
}

impl monotonic_clock::Host for DeadlineClockView<'_> {
    fn now(&mut self) -> wasmtime::Result<monotonic_clock::Instant> {
        self.clocks.now()
    }

    fn resolution(&mut self) -> wasmtime::Result<monotonic_clock::Duration> {
        self.clocks.resolution()
    }

    fn subscribe_instant(
        &mut self,
        when: monotonic_clock::Instant,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let wait = when.saturating_sub(self.clocks.now()?);
        self.subscribe_duration(wait)
    }

    fn subscribe_duration(
        &mut self,
        wait: monotonic_clock::Duration,
    ) -> wasmtime::Result<Resource<DynPollable>> {
        let wait = self.capped(wait);
        self.clocks.subscribe_duration(wait)
    }
}

/// Fixed clocks for capabilities: proposals must not depend on time.
struct FrozenWall;
impl wasmtime_wasi::HostWallClock for FrozenWall {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}
struct FrozenMonotonic;
impl wasmtime_wasi::HostMonotonicClock for FrozenMonotonic {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

impl LoadedPlugin {
    /// Audits `component`'s imports against `kind` and `grants`, links it and pre-instantiates it.
    /// `engine` must be the engine the component was compiled for (normally [`super::engine::engine`]).
    pub fn new(
        engine: &Engine,
        component: &Component,
        label: &str,
        kind: Kind,
        limits: Limits,
        grants: Vec<Grant>,
        uses: Vec<String>,
    ) -> PluginResult<LoadedPlugin> {
        let imports = audit_imports(engine, component, label, kind, &grants)?;
        if kind == Kind::Capability && !grants.is_empty() {
            return Err(PluginError::ImportNotGranted {
                plugin: label.to_string(),
                import: grants[0].render(),
                reason: "capabilities cannot hold permissions".into(),
            });
        }
        let linker = shared_linker(engine, kind)?;
        let load_err = |e: wasmtime::Error| PluginError::Load {
            plugin: label.to_string(),
            detail: format!("{e:#}"),
        };
        let instance_pre = linker.instantiate_pre(component).map_err(load_err)?;
        let pre = match kind {
            Kind::Capability => {
                Pre::Capability(cap::CapabilityPre::new(instance_pre).map_err(|e| {
                    PluginError::Load {
                        plugin: label.to_string(),
                        detail: format!("not a loopx:plugin capability component: {e:#}"),
                    }
                })?)
            }
            Kind::Provider => Pre::Provider(prov::ProviderPre::new(instance_pre).map_err(|e| {
                PluginError::Load {
                    plugin: label.to_string(),
                    detail: format!("not a loopx:plugin provider component: {e:#}"),
                }
            })?),
        };
        Ok(LoadedPlugin {
            label: label.to_string(),
            kind,
            limits,
            uses,
            imports,
            revision: None,
            grants,
            engine: engine.clone(),
            pre,
        })
    }

    /// The same component, recorded as loaded from installed revision `revision`.
    pub(crate) fn of_revision(mut self, revision: i64) -> LoadedPlugin {
        self.revision = Some(revision);
        self
    }

    fn call_limits(&self) -> CallLimits {
        CallLimits {
            fuel: self.limits.fuel,
            deadline_ms: self.limits.deadline_ms,
            memory_bytes: self.limits.memory_bytes,
            stack_bytes: MAX_WASM_STACK,
            output_bytes: self.limits.output_bytes,
        }
    }

    /// A fresh store for one call. `caller_deadline` is the deadline of the call this one serves
    /// (a capability's, for a provider it calls): the call gets the earlier of that and its own.
    fn store(
        &self,
        logs: &LogBuffer,
        broker: Option<Broker>,
        caller_deadline: Option<Instant>,
    ) -> PluginResult<Store<HostState>> {
        let mut b = WasiCtxBuilder::new();
        b.stdout(logs.stream(&self.label, "stdout"));
        b.stderr(logs.stream(&self.label, "stderr"));
        b.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        match self.kind {
            Kind::Capability => {
                b.wall_clock(FrozenWall);
                b.monotonic_clock(FrozenMonotonic);
                b.secure_random(wasmtime_wasi::Deterministic::new(vec![
                    0x5a, 0xa5, 0x3c, 0xc3,
                ]));
                b.insecure_random(wasmtime_wasi::Deterministic::new(vec![0x17, 0x71]));
                b.insecure_random_seed(0);
            }
            Kind::Provider => {
                for g in &self.grants {
                    match (&g.permission, &g.host_path) {
                        (Permission::FsRead(name), Some(dir))
                        | (Permission::FsWrite(name), Some(dir)) => {
                            let perms = if matches!(g.permission, Permission::FsWrite(_)) {
                                FsPerms::ReadWrite
                            } else {
                                FsPerms::ReadOnly
                            };
                            b.preopened_dir(dir, format!("/{name}"), perms)
                                .map_err(|e| {
                                    PluginError::not_found(
                                        format!(
                                            "granted directory {} (for {} of {})",
                                            dir.display(),
                                            g.render(),
                                            self.label
                                        ),
                                        format!("{e}; re-grant it with `loopx extension upgrade`"),
                                    )
                                })?;
                        }
                        (Permission::Env(var), _) => {
                            if let Ok(value) = std::env::var(var) {
                                b.env(var, value);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory_bytes as usize)
            .table_elements(100_000)
            .instances(32)
            .tables(32)
            .memories(8)
            .trap_on_grow_failure(true)
            .build();
        let own = Instant::now() + Duration::from_millis(self.limits.deadline_ms);
        let deadline = caller_deadline.map_or(own, |d| d.min(own));
        let remaining_ms = u64::try_from(
            deadline
                .saturating_duration_since(Instant::now())
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let state = HostState {
            wasi: b.build(),
            table: ResourceTable::new(),
            deadline,
            wait_cut: false,
            limits,
            plugin: self.label.clone(),
            logs: logs.clone(),
            broker,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store
            .set_fuel(self.limits.fuel)
            .map_err(|e| PluginError::host("setting fuel", e))?;
        store.set_epoch_deadline(deadline_ticks(remaining_ms));
        store.epoch_deadline_trap();
        store.set_hostcall_fuel(self.limits.output_bytes);
        Ok(store)
    }

    fn finish(
        &self,
        store: &Store<HostState>,
        started: Instant,
        logs: &LogBuffer,
        report: &mut CallReport,
        drain: bool,
    ) {
        report.plugin = self.label.clone();
        report.elapsed_us = started.elapsed().as_micros() as u64;
        report.fuel_consumed = store
            .get_fuel()
            .ok()
            .map(|left| self.limits.fuel.saturating_sub(left));
        if drain {
            report.logs = logs.take();
        }
    }

    /// Calls `describe`.
    pub fn describe(&self) -> (PluginResult<PluginInfo>, CallReport) {
        let logs = LogBuffer::new(self.limits.log_bytes);
        let mut report = CallReport::default();
        let started = Instant::now();
        let mut store = match self.store(&logs, None, None) {
            Ok(s) => s,
            Err(e) => return (Err(e), report),
        };
        let result = match &self.pre {
            Pre::Capability(pre) => pre
                .instantiate(&mut store)
                .and_then(|i| i.call_describe(&mut store)),
            Pre::Provider(pre) => pre
                .instantiate(&mut store)
                .and_then(|i| i.call_describe(&mut store)),
        };
        let result = deadline_held(&store, result)
            .map(bindings::info_from_wit)
            .map_err(|e| classify(&self.label, &self.call_limits(), e));
        self.finish(&store, started, &logs, &mut report, true);
        (result, report)
    }

    /// Calls a capability's `propose`. `providers` holds the loaded providers the capability may
    /// reach (normally exactly its `uses`, minus disabled ones).
    pub fn propose(
        &self,
        input: &CapabilityInput,
        providers: HashMap<String, Arc<LoadedPlugin>>,
    ) -> (PluginResult<Vec<Transition>>, CallReport) {
        let logs = LogBuffer::new(self.limits.log_bytes);
        let mut report = CallReport {
            plugin: self.label.clone(),
            ..CallReport::default()
        };
        let Pre::Capability(pre) = &self.pre else {
            let e = PluginError::BadRequest {
                detail: format!("{} is a provider, not a capability", self.label),
            };
            return (Err(e), report);
        };
        if input.payload.len() > MAX_PAYLOAD_BYTES {
            let e = PluginError::InputTooLarge {
                plugin: self.label.clone(),
                len: input.payload.len(),
                limit: MAX_PAYLOAD_BYTES,
            };
            return (Err(e), report);
        }
        let broker = Broker {
            capability: self.label.clone(),
            declared: self.uses.clone(),
            providers,
            max_calls: self.limits.max_provider_calls,
            used: 0,
            deadline_ms: self.limits.deadline_ms,
            calls: Vec::new(),
            violation: None,
        };
        let started = Instant::now();
        let mut store = match self.store(&logs, Some(broker), None) {
            Ok(s) => s,
            Err(e) => return (Err(e), report),
        };
        let wit_input = wit::ProposeInput {
            goal: bindings::goal_to_wit(&input.goal),
            agent_id: input.agent_id.clone(),
            payload: input.payload.clone(),
        };
        let raw = pre
            .instantiate(&mut store)
            .and_then(|i| i.call_propose(&mut store, &wit_input));
        let raw = deadline_held(&store, raw);
        self.finish(&store, started, &logs, &mut report, true);
        let broker = store.data_mut().broker.take();
        if let Some(b) = &broker {
            report.provider_calls = b.calls.clone();
        }
        let result = match raw {
            Err(e) => Err(classify(&self.label, &self.call_limits(), e)),
            Ok(_) if broker.as_ref().is_some_and(|b| b.violation.is_some()) => {
                Err(broker.and_then(|b| b.violation).expect("checked above"))
            }
            Ok(Err(e)) => Err(PluginError::GuestError {
                plugin: self.label.clone(),
                detail: bindings::wit_error_text(&e),
            }),
            Ok(Ok(list)) => self.check_proposals(list),
        };
        (result, report)
    }

    fn check_proposals(&self, list: Vec<wit::Transition>) -> PluginResult<Vec<Transition>> {
        if list.len() > MAX_PROPOSALS_PER_CALL {
            return Err(PluginError::TooManyItems {
                plugin: self.label.clone(),
                what: "proposals",
                count: list.len(),
                limit: MAX_PROPOSALS_PER_CALL,
            });
        }
        let out: Vec<Transition> = list
            .into_iter()
            .map(bindings::transition_from_wit)
            .collect();
        for (i, t) in out.iter().enumerate() {
            if let Transition::AddTodo { depends_on, .. } = t
                && depends_on.len() > MAX_DEPENDS_ON
            {
                return Err(PluginError::TooManyItems {
                    plugin: self.label.clone(),
                    what: "depends_on entries in one proposal",
                    count: depends_on.len(),
                    limit: MAX_DEPENDS_ON,
                });
            }
            for (field, _, text) in t.text_fields() {
                if text.len() > MAX_PROPOSAL_TEXT {
                    return Err(PluginError::StringTooLong {
                        plugin: self.label.clone(),
                        field: format!("proposal[{i}] ({}) {field}", t.kind()),
                        len: text.len(),
                        limit: MAX_PROPOSAL_TEXT,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Calls a provider's `observe` with a fresh log buffer. The call ends within its deadline plus
    /// [`DEADLINE_SLACK_MS`] even when the provider is blocked in a host call (see [`run_bounded`]).
    pub fn observe(
        self: &Arc<Self>,
        request: &ObserveRequest,
    ) -> (PluginResult<Observation>, CallReport) {
        let logs = LogBuffer::new(self.limits.log_bytes);
        run_bounded(self, request, &logs, true, None).unwrap_or_else(|| {
            let report = CallReport {
                plugin: self.label.clone(),
                logs: logs.take(),
                ..CallReport::default()
            };
            let err = PluginError::Deadline {
                plugin: self.label.clone(),
                limit_ms: self.limits.deadline_ms,
            };
            (Err(err), report)
        })
    }

    fn run_observe(
        &self,
        request: &ObserveRequest,
        logs: &LogBuffer,
        drain: bool,
        caller_deadline: Option<Instant>,
    ) -> (PluginResult<Observation>, CallReport) {
        let mut report = CallReport {
            plugin: self.label.clone(),
            ..CallReport::default()
        };
        let Pre::Provider(pre) = &self.pre else {
            let e = PluginError::BadRequest {
                detail: format!("{} is a capability, not a provider", self.label),
            };
            return (Err(e), report);
        };
        let req_size = request.operation.len()
            + request.target.len()
            + request
                .params
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>();
        if req_size > MAX_PAYLOAD_BYTES {
            let e = PluginError::InputTooLarge {
                plugin: self.label.clone(),
                len: req_size,
                limit: MAX_PAYLOAD_BYTES,
            };
            return (Err(e), report);
        }
        let started = Instant::now();
        let mut store = match self.store(logs, None, caller_deadline) {
            Ok(s) => s,
            Err(e) => return (Err(e), report),
        };
        let wit_req = bindings::request_to_wit(request);
        let raw = pre
            .instantiate(&mut store)
            .and_then(|i| i.call_observe(&mut store, &wit_req));
        let raw = deadline_held(&store, raw);
        self.finish(&store, started, logs, &mut report, drain);
        let result = match raw {
            Err(e) => Err(classify(&self.label, &self.call_limits(), e)),
            Ok(Err(e)) => Err(PluginError::GuestError {
                plugin: self.label.clone(),
                detail: bindings::wit_error_text(&e),
            }),
            Ok(Ok(o)) => self.check_observation(bindings::observation_from_wit(o)),
        };
        (result, report)
    }

    fn check_observation(&self, mut o: Observation) -> PluginResult<Observation> {
        o.source = self.label.clone();
        if o.facts.len() > MAX_FACTS {
            return Err(PluginError::TooManyItems {
                plugin: self.label.clone(),
                what: "facts",
                count: o.facts.len(),
                limit: MAX_FACTS,
            });
        }
        let mut fields: Vec<(&str, usize)> =
            vec![("kind", o.kind.len()), ("summary", o.summary.len())];
        for f in &o.facts {
            fields.push(("fact key", f.key.len()));
            fields.push(("fact value", f.value.len()));
        }
        for (field, len) in fields {
            if len > MAX_OBSERVATION_TEXT {
                return Err(PluginError::StringTooLong {
                    plugin: self.label.clone(),
                    field: format!("observation {field}"),
                    len,
                    limit: MAX_OBSERVATION_TEXT,
                });
            }
        }
        Ok(o)
    }
}
