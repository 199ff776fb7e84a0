//! `cargo xtask test-cluster`: the cluster tier alone (tests/tests/cluster.rs), with what it
//! needs first: the Kubernetes components built from Go modules (`setup --for cluster`) and the
//! release build its image is made of. Not part of `cargo xtask test` (yet): its first Go build
//! takes long, and whether CI's 90 minutes hold it is decided on its timings.

use std::time::Instant;

use anyhow::{Context, Result};

use crate::setup::{self, Scope};
use crate::test::{print_summary, run_tests};
use crate::util;

/// The cluster tier's test binary.
const CLUSTER_TEST: &str = "cluster";

pub fn run() -> Result<()> {
    util::require_root(
        "cargo xtask test-cluster",
        "the cluster's node is made of namespaces and cgroups, and ipq loads BPF programs",
    )?;
    let began = Instant::now();
    setup::ensure(Scope::Cluster)?;
    println!("==> release build (what ipq's image ships)");
    let mut release = util::cargo([
        "build",
        "--release",
        "-p",
        "ipq",
        "-p",
        "ipq-cni",
        "-p",
        "ipq-cli",
        "--bins",
    ]);
    release.current_dir(util::workspace_root());
    util::run(&mut release).context("xtask test-cluster: the release build failed")?;
    println!("==> cluster tier");
    let mut test = util::cargo([
        "test",
        "-p",
        "ipq-tests",
        "--test",
        CLUSTER_TEST,
        "--",
        // The tier prints each phase's duration.
        "--nocapture",
    ]);
    test.env("RUST_BACKTRACE", "1");
    let results = run_tests(test, false).context("xtask test-cluster: the tier failed")?;
    print_summary(&results.all, &[]);
    println!("xtask test-cluster: done in {:.0?}", began.elapsed());
    Ok(())
}
