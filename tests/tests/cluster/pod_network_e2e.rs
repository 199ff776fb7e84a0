//! Kubernetes' own networking conformance tests on the three-node cluster (#37): specs of
//! `e2e.test`, built from `k8s.io/kubernetes` at the control plane's version, run once before
//! ipq is installed and once with ipq chained into flannel in enforce mode: every spec that
//! passes without ipq must pass with it, and without ipq every one of them must pass (else the
//! cluster, not ipq, is what a failure says).
//!
//! The specs ([`SPECS`]): the pod network itself (`Networking Granular Checks: Pods`: pod to
//! pod and node to pod, over HTTP and UDP, across flannel), and Services through kube-proxy
//! and CoreDNS (`Services`: a ClusterIP's endpoints as pods come and go, several ports, a
//! NodePort reached on every node's address, a type changed from ExternalName, TCP and UDP on
//! one port), each reached by its ClusterIP and by its name; and the cluster's DNS (`DNS`: the
//! API server's Service, a headless and a regular Service with their SRV and PTR records by
//! full and partial names, pods' hostnames and subdomains, an ExternalName's CNAME as it
//! changes, `/etc/hosts`, asked over UDP and TCP from two resolvers, the results read through
//! the API server's proxy to the pod; and a pod's own DNS config). The rest of
//! `[sig-network]`'s conformance specs are not run here: docs/testing.md lists them and why.

use std::{collections::BTreeMap, fs, os::unix::fs::symlink, path::PathBuf, time::Duration};

use anyhow::{bail, ensure, Context as _};
use ipq_tests::cluster::{daemon::component, image, node, Cluster};
use serde_json::Value;

/// The specs, by the names ginkgo gives them (after `[sig-network] `, before their labels):
/// each is focused exactly, and each must run.
const SPECS: [&str; 17] = [
    "Networking Granular Checks: Pods should function for intra-pod communication: http ",
    "Networking Granular Checks: Pods should function for intra-pod communication: udp ",
    "Networking Granular Checks: Pods should function for node-pod communication: http ",
    "Networking Granular Checks: Pods should function for node-pod communication: udp ",
    "Services should serve a basic endpoint from pods ",
    "Services should serve multiport endpoints from pods ",
    "Services should be able to create a functioning NodePort service ",
    "Services should be able to change the type from ExternalName to ClusterIP ",
    "Services should serve endpoints on same port and different protocols ",
    "DNS should provide DNS for the cluster ",
    "DNS should provide DNS for services ",
    "DNS should provide /etc/hosts entries for the cluster ",
    "DNS should resolve DNS of partial qualified names for services ",
    "DNS should provide DNS for pods for Hostname ",
    "DNS should provide DNS for pods for Subdomain ",
    "DNS should provide DNS for ExternalName services ",
    "DNS should support configurable pod DNS nameservers ",
];
/// The images those specs' pods run (test/utils/image/manifest.go of the pinned version).
const AGNHOST_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.59";
/// The DNS specs' second querier: Debian with dnsutils. (The registry's images pair glibc's
/// resolver with agnhost's alpine musl; the images made here both have Debian's dig.)
const JESSIE_DNSUTILS_IMAGE: &str = "registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7";
/// What a spec runs inside these pods besides agnhost (the images have them): a shell, curl
/// for the HTTP checks, an nc that speaks UDP, dig for the DNS probes and getent for
/// `/etc/hosts`. The shell is dash: Debian's static busybox runs its own applets before
/// anything on PATH, and its nc has no `-u`.
const TOOLS: [(&str, &str); 5] = [
    ("/usr/bin/dash", "/bin/sh"),
    ("/usr/bin/curl", "/usr/bin/curl"),
    ("/usr/bin/nc", "/usr/bin/nc"),
    ("/usr/bin/dig", "/usr/bin/dig"),
    ("/usr/bin/getent", "/usr/bin/getent"),
];
/// Busybox for the rest: the specs' commands pipe through grep (`... | grep -v '^\s*$'`), an
/// ExternalName Service is checked with nslookup, the DNS probes loop over `seq`.
const APPLETS: [&str; 15] = [
    "cat", "echo", "ls", "sleep", "hostname", "grep", "sed", "head", "tail", "wc", "tr", "cut",
    "env", "nslookup", "seq",
];

/// Each spec's name and how it ended (`passed`, `failed`, …) in one run of the focus.
pub type Outcomes = BTreeMap<String, String>;

/// The specs' images, made from the machine's tools (and for agnhost, the binary setup
/// builds), imported into every node's containerd under the names the specs ask for.
pub fn import_images(cluster: &Cluster) -> anyhow::Result<()> {
    import_image(cluster, "agnhost", AGNHOST_IMAGE, true)?;
    import_image(cluster, "jessie-dnsutils", JESSIE_DNSUTILS_IMAGE, false)
}

fn import_image(
    cluster: &Cluster,
    name: &str,
    reference: &str,
    with_agnhost: bool,
) -> anyhow::Result<()> {
    let work = cluster.host.dir().join("images").join(name);
    let rootfs = work.join("rootfs");
    for dir in ["bin", "usr/bin", "etc", "tmp", "proc", "sys", "dev"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    let entrypoint = if with_agnhost {
        fs::copy(component("agnhost")?, rootfs.join("agnhost"))?;
        "/agnhost"
    } else {
        "/bin/sh"
    };
    fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .context("copying /bin/busybox (install busybox-static)")?;
    for applet in APPLETS {
        symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    for (path, inside) in TOOLS {
        fs::copy(path, rootfs.join(inside.trim_start_matches('/'))).with_context(|| {
            format!(
                "copying {path} (cargo xtask setup installs curl, netcat-openbsd and \
                 bind9-dnsutils)"
            )
        })?;
    }
    // glibc's resolver (nc, curl, getent) reads /etc/hosts first, as the images' own do.
    fs::write(rootfs.join("etc/nsswitch.conf"), "hosts: files dns\n")?;
    let tools: Vec<PathBuf> = TOOLS.iter().map(|(path, _)| PathBuf::from(path)).collect();
    image::copy_linked_libraries(&rootfs, &tools)?;
    let archive = ipq_tests::oci::archive(
        &rootfs,
        &work,
        reference,
        &[entrypoint],
        &["PATH=/bin:/usr/bin"],
    )?;
    for host in cluster.hosts() {
        node::import_image(host, &archive)?;
    }
    Ok(())
}

/// How many of the outcomes are of `spec`.
fn ran(outcomes: &Outcomes, spec: &str) -> usize {
    outcomes
        .keys()
        .filter(|name| spec_of(name).is_some_and(|rest| rest.starts_with(spec)))
        .count()
}

/// A spec's name without its `[sig-network] ` prefix, if it has it.
fn spec_of(name: &str) -> Option<&str> {
    name.strip_prefix("[sig-network] ")
}

/// `[sig-network] <spec>` as a ginkgo focus: the text, its regex metacharacters escaped.
fn focus(spec: &str) -> String {
    let mut focus = String::from(r"\[sig-network\] ");
    for c in spec.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            focus.push('\\');
        }
        focus.push(c);
    }
    focus
}

/// Runs the specs with `e2e.test` against the cluster (from node A, as kubectl runs); each
/// spec's outcome. `label` names the run's report.
pub fn run(cluster: &Cluster, label: &str) -> anyhow::Result<Outcomes> {
    let report: PathBuf = cluster.host.dir().join(format!("e2e-{label}.json"));
    let _ = fs::remove_file(&report);
    let mut e2e = cluster.host.command(component("e2e.test")?);
    e2e.arg(format!(
        "--kubeconfig={}",
        cluster.admin_kubeconfig().display()
    ))
    .args(
        SPECS
            .iter()
            .map(|spec| format!("--ginkgo.focus={}", focus(spec))),
    )
    .arg(format!("--ginkgo.json-report={}", report.display()))
    .args([
        "--provider=skeleton",
        "--ginkgo.no-color",
        "--ginkgo.timeout=25m",
        "--allowed-not-ready-nodes=0",
    ]);
    let out = ipq_tests::podman::run_bounded(&mut e2e, Duration::from_secs(30 * 60))?;
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
    if let Err(e) = each_spec_once(&outcomes) {
        bail!("e2e.test ({label}): {e}\n{}", tail(&out.stdout));
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

/// Each spec ran, once: a focus that matched another spec too, or none, shows here.
fn each_spec_once(outcomes: &Outcomes) -> anyhow::Result<()> {
    let not_once: Vec<&str> = SPECS
        .iter()
        .filter(|spec| ran(outcomes, spec) != 1)
        .copied()
        .collect();
    ensure!(
        not_once.is_empty() && outcomes.len() == SPECS.len(),
        "did not run each of the {} specs once (not once: {not_once:?}): {outcomes:?}",
        SPECS.len()
    );
    Ok(())
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
        "{label}: Kubernetes' networking specs did not pass: {failed:?} ({outcomes:?})"
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
            let Some(spec_name) = spec_of(&name) else {
                continue;
            };
            if !(SPECS.iter().any(|spec| spec_name.starts_with(spec))
                && name.contains("[Conformance]"))
            {
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

/// The report's reading and the once-each check, on reports shaped as ginkgo writes them
/// (`--ginkgo.json-report`): a check that cannot refuse would prove nothing about the run.
#[cfg(test)]
mod report_checks {
    use serde_json::json;

    use super::*;

    fn spec_report(spec: &str, state: &str) -> Value {
        let (container, leaf) = spec.split_once(" should ").expect("a spec's `should`");
        json!({
            "LeafNodeType": "It",
            "ContainerHierarchyTexts": ["[sig-network] ".to_owned() + container],
            "LeafNodeText": format!("should {}[Conformance]", leaf),
            "State": state,
            // outcomes() prints a failed spec's message: this one says where it comes from.
            "Failure": { "Message": "a failure made up by report_checks, no spec ran" },
        })
    }

    fn report(specs: &[Value]) -> String {
        json!([{ "SpecReports": specs }]).to_string()
    }

    fn all_specs(state: &str) -> Vec<Value> {
        SPECS.iter().map(|spec| spec_report(spec, state)).collect()
    }

    #[test]
    fn every_spec_once_is_read_and_accepted() -> anyhow::Result<()> {
        let mut specs = all_specs("passed");
        // A spec the focus left out: skipped, not one of ours, not read.
        specs.push(spec_report("Services should be rejected ", "skipped"));
        let outcomes = outcomes(&report(&specs))?;
        assert_eq!(outcomes.len(), SPECS.len(), "{outcomes:?}");
        each_spec_once(&outcomes)?;
        all_passed(&outcomes, "test")?;
        Ok(())
    }

    #[test]
    fn a_spec_missing_or_matched_twice_is_refused_by_name() -> anyhow::Result<()> {
        let mut missing = all_specs("passed");
        missing.remove(4);
        let error = each_spec_once(&outcomes(&report(&missing))?)
            .expect_err("a spec that did not run")
            .to_string();
        assert!(
            error.contains(&format!("not once: [{:?}]", SPECS[4])),
            "{error}"
        );

        // Another spec the same focus would also match (its name extends one of ours, with
        // the space at the end of ours kept) while one of ours did not run: as many outcomes
        // as specs, which a count alone would take; refused, both named.
        let mut twice = missing;
        let mut extra = spec_report(SPECS[9], "passed");
        extra["LeafNodeText"] = json!("should provide DNS for the cluster  again [Conformance]");
        twice.push(extra);
        let outcomes = outcomes(&report(&twice))?;
        assert_eq!(outcomes.len(), SPECS.len());
        let error = each_spec_once(&outcomes)
            .expect_err("a spec matched twice")
            .to_string();
        let named = format!("not once: [{:?}, {:?}]", SPECS[4], SPECS[9]);
        assert!(error.contains(&named), "{error}");
        Ok(())
    }

    #[test]
    fn a_failed_spec_fails_the_baseline_and_the_comparison() -> anyhow::Result<()> {
        let without = outcomes(&report(&all_specs("passed")))?;
        let mut specs = all_specs("passed");
        specs[0] = spec_report(SPECS[0], "failed");
        let with = outcomes(&report(&specs))?;
        each_spec_once(&with)?;
        assert!(all_passed(&with, "test").is_err());
        let error = none_broken_by_ipq(&without, &with)
            .expect_err("a spec broken with ipq")
            .to_string();
        assert!(error.contains(SPECS[0].trim_end()), "{error}");
        none_broken_by_ipq(&without, &without)?;
        Ok(())
    }

    #[test]
    fn the_focus_escapes_what_regexes_read() {
        assert_eq!(
            focus("DNS should provide /etc/hosts entries (x) [y] "),
            r"\[sig-network\] DNS should provide /etc/hosts entries \(x\) \[y\] "
        );
    }
}
