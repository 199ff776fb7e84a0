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
    /// Measure the control plane at registry sizes 1, 1k, 16k, 64k (needs root; not a test)
    Bench {
        /// A smoke run: sizes 1 and 1000, one trial
        #[arg(long)]
        quick: bool,
        /// Registry sizes, comma-separated
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<u32>>,
        /// Trials per figure
        #[arg(long)]
        trials: Option<u32>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(setup::Scope::All),
        Command::BuildEbpf { release } => build_ebpf::run(release),
        Command::Test { args } => test::run(&args),
        Command::Bench {
            quick,
            sizes,
            trials,
        } => bench::run(quick, sizes, trials),
        Command::Demo => {
            util::require_root(
                "cargo xtask demo",
                "the demo loads BPF programs and creates network namespaces",
            )?;
            setup::ensure(setup::Scope::All)?;
            demo::run()
        }
    }
}
