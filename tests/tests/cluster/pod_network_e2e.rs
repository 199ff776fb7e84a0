//! Kubernetes' own pod-network conformance tests on the three-node cluster (#37): the
//! `[sig-network] Networking Granular Checks: Pods` specs of `e2e.test` (pod to pod over HTTP
//! and UDP, node to pod over HTTP and UDP, across flannel), built from `k8s.io/kubernetes` at
//! the control plane's version, run once before ipq is installed and once with ipq chained
//! into flannel in enforce mode: every spec that passes without ipq must pass with it, and
//! without ipq every one of them must pass (else the cluster, not ipq, is what a failure says).
//!
//! Only these four of `[sig-network]`'s conformance specs run here: the rest need Services
//! (kube-proxy, which the tier does not run), cluster DNS (no CoreDNS here) or images only a
//! registry has (httpd, nginx); docs/testing.md lists them.

use std::{collections::BTreeMap, fs, os::unix::fs::symlink, path::PathBuf, time::Duration};

use anyhow::{bail, ensure, Context as _};
use ipq_tests::cluster::{daemon::component, image, node, Cluster};
use serde_json::Value;

/// The specs: Kubernetes' conformance checks of the pod network itself (not the SCTP ones
/// beside them, a feature this machine's kernel is built without).
const FOCUS: &str = r"\[sig-network\] Networking Granular Checks: Pods .*\[Conformance\]";
/// How many specs the focus selects in v1.35.
const SPECS: usize = 4;
/// The image those specs' pods run (test/utils/image/manifest.go of the pinned version).
const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";
/// What a spec runs inside agnhost's pods besides agnhost (the image's alpine has them): a
/// shell, curl for the HTTP checks and an nc that speaks UDP. The shell is dash: Debian's
/// static busybox runs its own applets before anything on PATH, and its nc has no `-u`.
const TOOLS: [(&str, &str); 3] = [
    ("/usr/bin/dash", "/bin/sh"),
    ("/usr/bin/curl", "/usr/bin/curl"),
    ("/usr/bin/nc", "/usr/bin/nc"),
];
/// Busybox for the rest: the specs' commands pipe through grep (`... | grep -v '^\s*$'`).
const APPLETS: [&str; 13] = [
    "cat", "echo", "ls", "sleep", "hostname", "grep", "sed", "head", "tail", "wc", "tr", "cut",
    "env",
];

/// Each spec's name and how it ended (`passed`, `failed`, …) in one run of the focus.
pub type Outcomes = BTreeMap<String, String>;

/// agnhost's image, made from the binary setup builds and the machine's curl and nc, imported
/// into every node's containerd under the name the specs ask for.
pub fn import_agnhost(cluster: &Cluster) -> anyhow::Result<()> {
    let work = cluster.host.dir().join("images/agnhost");
    let rootfs = work.join("rootfs");
    for dir in ["bin", "usr/bin", "etc", "tmp", "proc", "sys", "dev"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    let agnhost = component("agnhost")?;
    fs::copy(&agnhost, rootfs.join("agnhost"))?;
    fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .context("copying /bin/busybox (install busybox-static)")?;
    for applet in APPLETS {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    for (path, inside) in TOOLS {
        fs::copy(path, rootfs.join(inside.trim_start_matches('/'))).with_context(|| {
            format!("copying {path} (cargo xtask setup installs curl and netcat-openbsd)")
        })?;
    }
    let tools: Vec<PathBuf> = TOOLS.iter().map(|(path, _)| PathBuf::from(path)).collect();
    image::copy_linked_libraries(&rootfs, &tools)?;
    let archive = ipq_tests::oci::archive(
        &rootfs,
        &work,
        AGNHOST_IMAGE,
        &["/agnhost"],
        &["PATH=/bin:/usr/bin"],
    )?;
    for host in cluster.hosts() {
        node::import_image(host, &archive)?;
    }
    Ok(())
}

/// Runs the focus with `e2e.test` against the cluster (from node A, as kubectl runs); each
/// spec's outcome. `label` names the run's report.
pub fn run(cluster: &Cluster, label: &str) -> anyhow::Result<Outcomes> {
    let report: PathBuf = cluster.host.dir().join(format!("e2e-{label}.json"));
    let _ = fs::remove_file(&report);
    let mut e2e = cluster.host.command(component("e2e.test")?);
    e2e.arg(format!(
        "--kubeconfig={}",
        cluster.admin_kubeconfig().display()
    ))
    .arg(format!("--ginkgo.focus={FOCUS}"))
    .arg(format!("--ginkgo.json-report={}", report.display()))
    .args([
        "--provider=skeleton",
        "--ginkgo.no-color",
        "--ginkgo.timeout=15m",
        "--allowed-not-ready-nodes=0",
    ]);
    let out = ipq_tests::podman::run_bounded(&mut e2e, Duration::from_secs(20 * 60))?;
    let text = fs::read_to_string(&report).with_context(|| {
        format!(
            "e2e.test ({label}) wrote no report ({}): {}{}",
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        )
    })?;
    let outcomes = outcomes(&text)
        .with_context(|| format!("e2e.test's report ({label}): {}", report.display()))?;
    eprintln!("cluster tier: e2e {label}: {outcomes:?}");
    if outcomes.len() != SPECS {
        bail!(
            "e2e.test ({label}) ran {} specs of {FOCUS:?}, not {SPECS}: {outcomes:?}\n{}",
            outcomes.len(),
            tail(&out.stdout)
        );
    }
    if !out.status.success() && outcomes.values().all(|state| state == "passed") {
        bail!(
            "e2e.test ({label}) failed ({}) with every spec passed: {}{}",
            out.status,
            tail(&out.stdout),
            tail(&out.stderr)
        );
    }
    Ok(outcomes)
}

/// The baseline must be whole: a spec that fails without ipq is the cluster's problem, and
/// would make the comparison prove nothing.
pub fn all_passed(outcomes: &Outcomes, label: &str) -> anyhow::Result<()> {
    let failed: Vec<&String> = outcomes
        .iter()
        .filter(|(_, state)| state.as_str() != "passed")
        .map(|(name, _)| name)
        .collect();
    ensure!(
        failed.is_empty(),
        "{label}: Kubernetes' pod-network specs did not pass: {failed:?} ({outcomes:?})"
    );
    Ok(())
}

/// Every spec that passed without ipq passed with it.
pub fn none_broken_by_ipq(without: &Outcomes, with: &Outcomes) -> anyhow::Result<()> {
    let broken: Vec<String> = without
        .iter()
        .filter(|(_, state)| state.as_str() == "passed")
        .filter(|(name, _)| with.get(*name).map(String::as_str) != Some("passed"))
        .map(|(name, _)| format!("{name}: {:?}", with.get(name)))
        .collect();
    ensure!(
        broken.is_empty(),
        "with ipq chained in enforce mode, specs that pass without it did not: {broken:?}"
    );
    Ok(())
}

/// The specs of ginkgo's JSON report that ran (the focus leaves the others `skipped` without
/// running them) and their states.
fn outcomes(report: &str) -> anyhow::Result<Outcomes> {
    let suites: Value = serde_json::from_str(report).context("not JSON")?;
    let mut outcomes = Outcomes::new();
    for suite in suites.as_array().context("not a list of suites")? {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"] != "It" {
                continue;
            }
            let mut name: Vec<&str> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            name.push(spec["LeafNodeText"].as_str().unwrap_or_default());
            let name = name.join(" ");
            if !(name.contains("Granular Checks: Pods") && name.contains("[Conformance]")) {
                continue;
            }
            let state = spec["State"].as_str().unwrap_or("unknown");
            if state != "passed" {
                // Why, as the suite says it: what a failure in CI is read from.
                let why: String = spec["Failure"]["Message"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(600)
                    .collect();
                eprintln!("cluster tier: e2e: {name}: {state}: {why}");
            }
            outcomes.insert(name, state.to_owned());
        }
    }
    Ok(outcomes)
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
