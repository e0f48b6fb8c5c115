//! The one shared wasmtime `Engine` and its epoch ticker.
//!
//! Why this exists: compiled code, the precompile compatibility hash and epoch deadlines are all
//! per-engine, so every component must be compiled and run by the same `Engine` configured once
//! (fuel metering, epoch interruption, a small wasm stack). Epochs advance on a dedicated OS thread
//! (never an async task: a guest `loop {}` on a single-threaded executor would starve it); the thread
//! holds only a weak reference, so it exits on its own once the engine is dropped.

use std::sync::OnceLock;
use std::time::Duration;

use wasmtime::{Config, Engine};

/// Milliseconds per epoch tick. Deadlines are rounded up to whole ticks (plus one).
pub const TICK_MS: u64 = 10;
/// Wasm stack limit for every guest (wasmtime's default is 512 KiB).
pub const MAX_WASM_STACK: usize = 256 * 1024;

static ENGINE: OnceLock<Engine> = OnceLock::new();

/// The process-wide engine, created (with its ticker thread) on first use.
pub fn engine() -> &'static Engine {
    ENGINE.get_or_init(|| {
        let engine = Engine::new(&config()).expect("the LoopX wasmtime configuration is valid");
        start_ticker(&engine);
        engine
    })
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
