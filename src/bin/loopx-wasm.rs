//! The `loopx-wasm` binary: the whole CLI with the WebAssembly engine linked in. `loopx` execs it
//! for `turn`, `loop`, `extension`, `capability` and `provider`; every other command works here
//! too, so it can also be called directly.

fn main() {
    std::process::exit(loopx::cli::main(loopx::cli::run_wasm_command));
}
