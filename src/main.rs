//! The `loopx` binary: everything lives in the library; this only sets the exit code.

fn main() {
    std::process::exit(loopx::cli::main());
}
