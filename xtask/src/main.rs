//! ipq's task runner: `cargo xtask <command>` (the alias is in `.cargo/config.toml`).
//!
//! It depends on no other crate of the workspace, so it builds, and can bootstrap the eBPF
//! tooling, on a machine that has none of it yet.

mod bench;
mod build_ebpf;
mod demo;
mod setup;
mod test;
mod tools;
mod util;

use std::ffi::OsString;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ipq's build, test and setup tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what building and testing needs (nightly, rust-src, bpf-linker, bpffs, Debian
    /// packages); idempotent: reports what was already there
    Setup,
    /// Build the eBPF programs (through the agent's build script) and print the object's path
    BuildEbpf {
        /// Build in release mode
        #[arg(long)]
        release: bool,
    },
    /// Run every check: fmt, clippy, build, then all tests (needs root)
    Test {
        /// Extra arguments for `cargo test`, after `--` (e.g. `cargo xtask test -- verdict`)
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// Run the demo (needs root)
    Demo,
    /// Measure performance figures (needs root); never part of `test`
    Bench {
        /// Fewer trials and smaller sizes: a smoke run
        #[arg(long)]
        quick: bool,
        /// Interleaved trials per figure
        #[arg(long, default_value_t = 5)]
        trials: u32,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(setup::Scope::All),
        Command::BuildEbpf { release } => build_ebpf::run(release),
        Command::Test { args } => test::run(&args),
        Command::Demo => {
            util::require_root(
                "cargo xtask demo",
                "the demo loads BPF programs and creates network namespaces",
            )?;
            setup::ensure(setup::Scope::All)?;
            demo::run()
        }
        Command::Bench { quick, trials } => {
            util::require_root(
                "cargo xtask bench",
                "the benchmarks create network namespaces and load BPF programs",
            )?;
            bench::run(&bench::BenchOptions {
                quick,
                sizes: vec![1, 1000, 16384, 65536],
                trials: if quick { trials.min(2) } else { trials },
            })
        }
    }
}
