//! The cluster tier (tests/tests/cluster.rs): the last step of `cargo xtask test`, and
//! `cargo xtask test-cluster` alone. It needs the Kubernetes components built from Go modules
//! (`setup --for cluster`: about 30 minutes the first time on 2 cores, seconds once Go's build
//! cache has them), the release build its image is made of, and the previous release it rolls
//! back to (built once per machine: `crate::previous_release`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::setup::{self, Scope};
use crate::test::{print_summary, run_tests, Totals};
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
    let totals = tier()?;
    print_summary(&totals, &[]);
    println!("xtask test-cluster: done in {:.0?}", began.elapsed());
    if totals.failed > 0 {
        anyhow::bail!("xtask test-cluster: {} failed", totals.failed);
    }
    Ok(())
}

/// The release build, then the tier's tests; their counts. Setup is the caller's.
pub fn tier() -> Result<Totals> {
    prepare()?.run()
}

/// What the tier's tests need built: the previous release, the release build the image is
/// made of, and the tier's test binary. Made before `cargo xtask test` boots the kernel tier's
/// guests beside the tier, so that no compile competes with them.
pub struct Prepared {
    previous: PathBuf,
}

pub fn prepare() -> Result<Prepared> {
    let previous = crate::previous_release::ensure()
        .context("the cluster tier's previous release (its rollback) could not be built")?;
    println!("==> release build (what ipq's image ships)");
    let mut release = util::release_build_of_shipped_binaries();
    release.current_dir(util::workspace_root());
    util::run(&mut release).context("the cluster tier's release build failed")?;
    let mut build = test_command();
    build.arg("--no-run").current_dir(util::workspace_root());
    util::run(&mut build).context("the cluster tier's test binary did not build")?;
    Ok(Prepared { previous })
}

/// `cargo test -p ipq-tests --test cluster`.
fn test_command() -> std::process::Command {
    util::cargo(["test", "-p", "ipq-tests", "--test", CLUSTER_TEST])
}

impl Prepared {
    /// Runs the tier's tests; their counts.
    pub fn run(self) -> Result<Totals> {
        println!("==> cluster tier");
        let mut test = test_command();
        test.args([
            "--",
            // The tier prints each phase's duration.
            "--nocapture",
            // One cluster at a time: each is a control plane and its nodes on the machine's
            // 2 cores.
            "--test-threads=1",
        ]);
        // As the host suite: a returned error prints its message, not anyhow's frames.
        test.env("RUST_BACKTRACE", "1")
            .env("RUST_LIB_BACKTRACE", "0");
        // The labs' agents (the tests with a control plane and no node) run the release build
        // just made, as the image does: the dev build is not made by this tier.
        test.env(
            "IPQ_AGENT_BINARY",
            util::workspace_root().join("target/release/ipq-agent"),
        );
        // The release the upgrade phase rolls the DaemonSet to and back from.
        test.env("IPQ_PREVIOUS_RELEASE", self.previous);
        let results = run_tests(test, false).context("the cluster tier failed")?;
        Ok(results.all)
    }
}
