//! The crates' boundaries, as cargo resolves them for a package built on its own (what
//! `cargo build -p ipq-cli` compiles): the API crate, the CLI and the CNI plugins pull in
//! neither aya, nor netlink, nor the agent, so an operator's `ipq`, the plugins a runtime runs
//! as root and whatever else speaks the API carry no eBPF loader and no registry; the agent
//! reaches the wire types through `ipq-api`, and shares the files with the plugins through
//! `ipq-fs` and the delegate runner through `ipq-delegate`, never through the plugins' crate.

use std::{collections::BTreeSet, process::Command};

/// The packages `cargo tree` lists for `package`'s normal dependencies on this platform.
fn dependencies(package: &str) -> BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args([
            "--locked",
            "--offline",
            "--target",
            "x86_64-unknown-linux-gnu",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo tree");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_api_crate_the_cli_and_the_plugins_pull_in_no_aya_no_netlink_and_no_agent() {
    for package in ["ipq-api", "ipq-cli", "ipq-cni"] {
        let deps = dependencies(package);
        assert!(deps.contains("ipq-common"), "{package}: {deps:?}");
        let forbidden: Vec<&String> = deps
            .iter()
            .filter(|d| d.starts_with("aya") || *d == "ipq" || d.starts_with("netlink"))
            .collect();
        assert!(forbidden.is_empty(), "{package} pulls in {forbidden:?}");
    }
    assert!(dependencies("ipq-cli").contains("ipq-api"));
    assert!(dependencies("ipq-cni").contains("ipq-api"));
}

/// The agent shares the files and the delegate runner with the plugins through their own
/// crates; the plugins' crate (their config, their commands, their conflist installer) is
/// theirs alone.
#[test]
fn the_agent_links_what_it_shares_with_the_plugins_but_not_the_plugins_crate() {
    let agent = dependencies("ipq");
    let plugins = dependencies("ipq-cni");
    for shared in ["ipq-api", "ipq-fs", "ipq-delegate"] {
        assert!(
            agent.contains(shared),
            "the agent links {shared}: {agent:?}"
        );
        assert!(
            plugins.contains(shared),
            "ipq-cni links {shared}: {plugins:?}"
        );
    }
    assert!(
        !agent.contains("ipq-cni"),
        "the agent depends on the plugins' crate ipq-cni: {agent:?}"
    );
    assert!(
        agent.contains("aya") && agent.iter().any(|d| d.starts_with("netlink")),
        "the check reads the tree it claims to"
    );
}
