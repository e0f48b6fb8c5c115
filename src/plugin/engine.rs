//! The one shared wasmtime `Engine` and its epoch ticker.
//!
//! Why this exists: compiled code, the precompile compatibility hash and epoch deadlines are all
//! per-engine, so every component must be compiled and run by the same `Engine` configured once
//! (fuel metering, epoch interruption, a small wasm stack). Epochs advance on a dedicated OS thread
//! (never an async task: a guest `loop {}` on a single-threaded executor would starve it); the thread
//! holds only a weak reference, so it exits on its own once the engine is dropped.

use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Milliseconds per epoch tick. Deadlines are rounded up to whole ticks (plus one).
pub const TICK_MS: u64 = 10;
/// Wasm stack limit for every guest (wasmtime's default is 512 KiB).
pub const MAX_WASM_STACK: usize = 256 * 1024;

static ENGINE: OnceLock<Engine> = OnceLock::new();

/// The process-wide engine, created (with its ticker thread) on first use.
///
/// It uses wasmtime's pooling instance allocator (memories, tables and instances pre-reserved and
/// reused, so a fresh instance per call costs microseconds instead of fresh `mmap`s), falling back
/// to on-demand allocation when the pool's virtual-address reservation is refused (e.g. under a
/// `ulimit -v`) or when `LOOPX_WASM_POOLING=0`.
pub fn engine() -> &'static Engine {
    ENGINE.get_or_init(|| {
        let pooled = std::env::var("LOOPX_WASM_POOLING")
            .map(|v| v != "0")
            .unwrap_or(true);
        let engine = pooled
            .then(|| {
                let mut c = config();
                c.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling()));
                Engine::new(&c).ok()
            })
            .flatten()
            .unwrap_or_else(|| {
                Engine::new(&config()).expect("the LoopX wasmtime configuration is valid")
            });
        start_ticker(&engine);
        engine
    })
}

/// Pool sizes: enough for a capability call plus the nested provider calls it makes, and for a
/// few threads calling at once; each slot is only virtual address space until used.
fn pooling() -> PoolingAllocationConfig {
    let mut p = PoolingAllocationConfig::new();
    p.total_component_instances(64)
        .total_core_instances(512)
        .total_memories(128)
        .total_tables(512)
        .total_gc_heaps(0)
        .max_core_instances_per_component(64)
        .max_memories_per_component(8)
        .max_tables_per_component(64)
        .table_elements(100_000)
        .max_memory_size((super::manifest::max::MEMORY_MIB << 20) as usize)
        // Reset reused slots by zeroing only the pages a call dirtied (PAGEMAP_SCAN, Linux 6.7+;
        // `Auto` falls back to madvise elsewhere) and keep them resident, so the next call does not
        // page-fault its stack and heap back in.
        .linear_memory_keep_resident(4 << 20)
        .table_keep_resident(64 << 10)
        .pagemap_scan(Enabled::Auto);
    p
}

/// The engine configuration. Kept in one function because the precompiled cache is only valid for
/// an identical configuration (see `cache`).
pub fn config() -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.consume_fuel(true);
    c.epoch_interruption(true);
    c.max_wasm_stack(MAX_WASM_STACK);
    // Guests never need threads, shared memory or GC proposals; keep the surface small.
    c.wasm_threads(false);
    c
}

fn start_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("loopx-epoch-ticker".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(TICK_MS));
                match weak.upgrade() {
                    Some(e) => e.increment_epoch(),
                    None => return,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}

/// Epoch ticks to allow for a deadline of `ms` milliseconds.
pub fn deadline_ticks(ms: u64) -> u64 {
    ms.div_ceil(TICK_MS) + 1
}

/// A stable hex key for this engine's compatibility (wasmtime version + configuration + target).
pub fn compatibility_key(engine: &Engine) -> String {
    use sha2::{Digest, Sha256};
    use std::hash::{Hash, Hasher};
    struct ShaHasher(Sha256);
    impl Hasher for ShaHasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    env!("CARGO_PKG_VERSION").hash(&mut h);
    hex::encode(&h.0.finalize()[..16])
}
