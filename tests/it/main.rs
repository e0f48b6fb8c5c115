//! The integration tests: one test binary with one module per suite. A single binary links
//! wasmtime and the crate once instead of once per suite (disk and link time; see
//! docs/decisions.md), and the guest components are built once per run. Every module drives the
//! real `loopx` binary or the library through [`support`].

mod support;

mod broken_machine;
mod claim_race;
mod cli_conventions;
mod crash_kill;
mod demo;
mod flag_ranges;
mod goal_probe;
mod inert_output;
mod input_limits;
mod kernel_cli;
mod long_project;
mod loop_agents;
mod loop_progress;
mod monitors;
mod output_snapshots;
mod parser_fuzz;
mod registry_inspect;
mod retention;
mod sandbox_admission;
mod sandbox_cli;
mod sandbox_install;
mod sandbox_limits;
mod sandbox_providers;
mod state_safety;
mod turn_capability;
mod turn_crash;
mod turn_examples;
mod turn_host;
mod turn_plan;
