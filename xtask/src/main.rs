//! ipq's task runner: `cargo xtask <command>` (the alias is in `.cargo/config.toml`).
//!
//! It depends on no other crate of the workspace, so it builds, and can bootstrap the eBPF
//! tooling, on a machine that has none of it yet.

mod bench;
mod build_ebpf;
mod cluster_build;
mod cross;
mod demo;
mod elf;
mod foreign_debs;
mod kernels;
mod previous_release;
mod setup;
mod stall;
mod test;
mod test_cluster;
mod toolchain;
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
    /// Install what building and testing needs (the pinned nightly, rust-src, bpf-linker, bpffs,
    /// Debian packages); idempotent: reports what was already there
    Setup {
        /// Set up only what one command uses; `cluster` builds the cluster tier's Kubernetes,
        /// etcd and containerd from Go modules (slow the first time)
        #[arg(long = "for", value_enum, default_value = "test")]
        scope: setup::Scope,
    },
    /// Build the shipped binaries (ipq-agent, ipq, ipq-cni, ipq-ipam) for one architecture
    /// into target/<triple>/, check each is an executable for it and that the agent embeds the
    /// same eBPF object as the host build (arm64 on an x86-64 machine: Debian's cross gcc)
    Build {
        /// amd64 or arm64
        #[arg(long, value_enum)]
        arch: cross::Arch,
        /// Build in release mode
        #[arg(long)]
        release: bool,
        /// Refuse to update Cargo.lock (cargo's --locked; the image's build uses it)
        #[arg(long)]
        locked: bool,
    },
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
    /// Run the kernel tier alone: Debian's kernels under QEMU running the datapath and lab
    /// tests (needs root); the kernels are listed in xtask/kernels.toml
    TestKernels {
        /// Kernels to boot, by name in xtask/kernels.toml (all of --arch when none is given)
        names: Vec<String>,
        /// The architecture: amd64 (qemu-system-x86_64, part of `cargo xtask test`) or arm64
        /// (qemu-system-aarch64 over the tests built for aarch64; its own command)
        #[arg(long, value_enum, default_value = "amd64")]
        arch: cross::Arch,
    },
    /// Run the cluster tier alone: a one-node Kubernetes cluster of the test's own (built from
    /// Go modules by `setup --for cluster`), ipq installed from deploy/kubernetes/, the
    /// incidents (needs root; also the last step of `cargo xtask test`)
    TestCluster,
    /// Build the previous release the cluster tier rolls back to (the commit
    /// xtask/previous-release.toml names: its binaries and Helm chart, from its own tree, into
    /// a cache outside the checkout) and print its directory; the cluster tier does it itself
    PreviousRelease,
    /// Run the demo (needs root)
    Demo {
        /// `netns`: the node wired by hand (the default); `containerd`: the same incident with
        /// pods run by containerd through its CRI, as the kubelet runs them; `kubernetes`: on a
        /// one-node cluster, ipq applied from deploy/kubernetes/ (builds Kubernetes first)
        #[arg(long, value_enum, default_value = "netns")]
        runtime: demo::Runtime,
        /// With `--runtime kubernetes`: 1 (the rollout incident) or 3 (the seeds' cross-node
        /// race on three nodes with flannel and whereabouts)
        #[arg(long, default_value_t = 1)]
        nodes: u8,
    },
    /// Measure the datapath (and the other sections): prints a table, writes
    /// target/bench/bench.json and target/bench/latency.svg (needs root; not a test)
    Bench {
        /// A smoke run: sizes 1 and 1000, 3 trials, shorter runs
        #[arg(long)]
        quick: bool,
        /// Registry sizes to measure at, comma-separated (default 1,1000,16384,65536)
        #[arg(long, value_delimiter = ',')]
        sizes: Option<Vec<u32>>,
        /// Interleaved trials per figure (default 7, quick 3)
        #[arg(long)]
        trials: Option<u32>,
        /// Run only these sections (e.g. --only datapath)
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Setup { scope } => setup::run(scope),
        Command::Build {
            arch,
            release,
            locked,
        } => cross::run(arch, release, locked),
        Command::BuildEbpf { release } => build_ebpf::run(release),
        Command::Test { args } => test::run(&args),
        Command::TestKernels { names, arch } => test::run_kernels(arch, &names),
        Command::TestCluster => test_cluster::run(),
        Command::PreviousRelease => previous_release::run(),
        Command::Demo { runtime, nodes } => {
            if nodes != 1 && !matches!(runtime, demo::Runtime::Kubernetes) {
                anyhow::bail!("--nodes {nodes} needs --runtime kubernetes");
            }
            if ![1, 3].contains(&nodes) {
                anyhow::bail!("--nodes is 1 or 3, not {nodes}");
            }
            util::require_root(
                "cargo xtask demo",
                "the demo loads BPF programs and creates network namespaces",
            )?;
            setup::ensure(runtime.setup_scope())?;
            match runtime {
                demo::Runtime::Netns => demo::run(),
                demo::Runtime::Containerd => demo::run_containerd(),
                demo::Runtime::Kubernetes => demo::run_kubernetes(nodes),
            }
        }
        Command::Bench {
            quick,
            sizes,
            trials,
            only,
        } => {
            setup::ensure(setup::Scope::All)?;
            bench::run(quick, sizes, trials, &only)
        }
    }
}
