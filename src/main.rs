//! The `loopx` binary: the kernel commands run here; the commands that execute WebAssembly are
//! handed to `loopx-wasm` (see `loopx::cli::exec_wasm_host`), so this binary never links the
//! engine and starts in about the time of a plain process spawn.

fn main() {
    std::process::exit(loopx::cli::main(loopx::cli::exec_wasm_host));
}
