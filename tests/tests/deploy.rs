//! The deployment artifacts in `deploy/`, checked with the tools their consumers use: promtool
//! for the alert rules, kubernetes-validate for the manifests, Grafana's published schema (with
//! tsc) for the dashboard, and the real agent's `/metrics` for every metric they name.
//!
//! The checkers are installed by `cargo xtask setup` (Debian's `prometheus` package for
//! promtool; kubernetes-validate and @grafana/schema under `target/tools/`). A missing one fails
//! the test with its name; nothing is skipped.

#[path = "deploy/support.rs"]
mod support;

use std::{collections::BTreeSet, fs, process::Command};

use ipq_tests::lab::{Lab, Scrape};
use serde_json::Value;
use support::*;

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let rules = deploy_path("prometheus/ipq-rules.yaml");
    let tests = deploy_path("prometheus/ipq-rules.test.yaml");
    for args in [["check", "rules"], ["test", "rules"]] {
        let file = if args[0] == "check" { &rules } else { &tests };
        let (ok, out) = run(Command::new("promtool").args(args).arg(file), PROMTOOL);
        assert!(ok, "promtool {} {}:\n{out}", args.join(" "), file.display());
        assert!(out.contains("SUCCESS"), "{out}");
    }
}

#[test]
fn every_alert_is_documented_and_unit_tested_firing_and_silent() {
    let rules = &yaml_documents(&deploy_path("prometheus/ipq-rules.yaml"))[0];
    let tests = &yaml_documents(&deploy_path("prometheus/ipq-rules.test.yaml"))[0];
    let mut fired = BTreeSet::new();
    let mut silent = BTreeSet::new();
    for case in array(&tests["tests"])
        .iter()
        .flat_map(|t| array(&t["alert_rule_test"]))
    {
        let name = string(&case["alertname"]).to_owned();
        match case.get("exp_alerts").and_then(Value::as_array) {
            Some(alerts) if !alerts.is_empty() => fired.insert(name),
            _ => silent.insert(name),
        };
    }
    let alerts = alert_rules(rules);
    assert!(
        alerts.len() >= 9,
        "expected the alerts of issue #5 and more: {alerts:?}"
    );
    for rule in &alerts {
        let name = string(&rule["alert"]);
        let severity = string(&rule["labels"]["severity"]);
        assert!(
            ["critical", "warning"].contains(&severity),
            "{name}: {severity}"
        );
        for key in ["summary", "description", "runbook"] {
            let text = rule["annotations"][key].as_str().unwrap_or_default();
            assert!(text.len() > 20, "{name}: annotation {key} missing or empty");
        }
        assert!(fired.contains(name), "{name}: no unit test shows it firing");
        assert!(
            silent.contains(name),
            "{name}: no unit test shows it silent"
        );
    }
}

#[test]
fn kubernetes_manifests_validate_strictly() {
    let validate = installed_tool("venv/bin/kubernetes-validate", KUBERNETES_VALIDATE);
    let manifests = manifest_files();
    assert!(manifests.len() >= 4, "{manifests:?}");
    for file in manifests {
        let (ok, out) = run(
            Command::new(&validate)
                .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
                .arg(&file),
            KUBERNETES_VALIDATE,
        );
        assert!(ok && out.contains("passed"), "{}:\n{out}", file.display());
        assert!(!out.contains("ERROR") && !out.contains("WARN"), "{out}");
    }
}

#[test]
fn daemonset_runs_with_least_privilege_and_answers_its_probes() {
    let ds = manifest("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert!(
        pod.get("hostPID").is_none_or(|v| v == false),
        "hostPID is not needed"
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    // Every Linux node of a mixed cluster: the image is built for amd64 and arm64, and the
    // agent orders IPQ_SLOTS' reads for its CPU (#38). No architecture is left out.
    assert_eq!(pod["nodeSelector"]["kubernetes.io/os"], "linux");
    assert!(
        pod["nodeSelector"].get("kubernetes.io/arch").is_none(),
        "an arch selector leaves nodes unprotected: {}",
        pod["nodeSelector"]
    );
    assert!(array(&pod["tolerations"])
        .iter()
        .any(|t| t["operator"] == "Exists" && t.get("key").is_none()));
    assert_eq!(ds["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(
        ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        1
    );

    // The API server allows Bidirectional propagation only in privileged containers (a rule
    // kubernetes-validate's schemas cannot express).
    let containers = array(&pod["containers"])
        .iter()
        .chain(array(&pod["initContainers"]));
    for c in containers {
        for m in array_or_empty(&c["volumeMounts"]) {
            if m["mountPropagation"] == "Bidirectional" {
                assert_eq!(c["securityContext"]["privileged"], true, "{}", c["name"]);
            }
        }
    }

    let agent = container(pod, "containers", "agent");
    let security = &agent["securityContext"];
    assert_ne!(security["privileged"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        security["capabilities"]["add"],
        serde_json::json!(["BPF", "NET_ADMIN", "NET_RAW", "PERFMON"])
    );
    for path in ["/sys/fs/bpf", "/var/lib/ipq", "/run/ipq", "/etc/ipq"] {
        assert!(
            mount_of(agent, path).is_some(),
            "agent does not mount {path}"
        );
    }
    assert_eq!(
        mount_of(agent, "/sys/fs/bpf").unwrap()["mountPropagation"],
        "HostToContainer"
    );
    assert_eq!(
        container(pod, "initContainers", "mount-bpffs")["volumeMounts"][0]["mountPropagation"],
        "Bidirectional"
    );

    // The scrape annotation and the bound address agree on one port.
    let port = agent["ports"][0]["containerPort"].as_u64().unwrap();
    let annotations = &ds["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], port.to_string());
    let args: Vec<&str> = array(&agent["command"]).iter().map(string).collect();
    assert!(
        args.contains(&format!("--metrics-addr=$(POD_IP):{port}").as_str()),
        "{args:?}"
    );
    assert_eq!(
        agent["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "status.podIP"
    );
    // The probes ask over the API socket (root's reserved slots), not the metrics port any
    // local user can fill (#39).
    assert_eq!(
        agent["livenessProbe"]["exec"]["command"],
        serde_json::json!(["ipq-agent", "probe", "healthz"])
    );
    assert_eq!(
        agent["readinessProbe"]["exec"]["command"],
        serde_json::json!(["ipq-agent", "probe", "readyz"])
    );
    assert!(agent["resources"]["requests"].is_object() && agent["resources"]["limits"].is_object());
}

#[test]
fn configmap_holds_a_valid_agent_config_that_matches_the_pod() {
    let config_map = manifest("ConfigMap");
    let text = string(&config_map["data"]["agent.toml"]);
    let config = ipq::config::Config::from_toml(text, "deploy ConfigMap agent.toml")
        .unwrap_or_else(|e| panic!("the ConfigMap's agent.toml is refused by the agent: {e}"));

    let ds = manifest("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let agent = container(pod, "containers", "agent");
    for dir in [
        &config.state_dir,
        &config.bpffs_dir,
        &config.api_socket.parent().unwrap().to_owned(),
    ] {
        let dir = dir.to_str().unwrap();
        let covered = array(&agent["volumeMounts"])
            .iter()
            .any(|m| dir.starts_with(string(&m["mountPath"])));
        assert!(
            covered,
            "{dir} from agent.toml is not on a host mount of the agent"
        );
    }
    // ipq-cni runs on the host and must find the agent's socket where the agent creates it.
    let install = container(pod, "initContainers", "install-cni");
    let socket = format!("--socket={}", config.api_socket.display());
    assert!(
        array(&install["command"])
            .iter()
            .any(|a| a == socket.as_str()),
        "{install}"
    );
    // With --hold-ipam the agent runs the wrapped IPAM plugin's DEL itself (#18): every CNI
    // bin dir it trusts is the host's, read-only at the same path (the release names the
    // runtime's CNI_PATH), and host-local's state dir is the host's, writable.
    let host_path = |mount: &Value| -> String {
        let volume = array(&pod["volumes"])
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap_or_else(|| panic!("no volume for {mount}"));
        string(&volume["hostPath"]["path"]).to_owned()
    };
    assert!(!config.ipam_cni_bin_dirs.is_empty());
    for dir in &config.ipam_cni_bin_dirs {
        let dir = dir.to_str().unwrap();
        let mount = mount_of(agent, dir)
            .unwrap_or_else(|| panic!("ipam_cni_bin_dirs has {dir}, which the agent lacks"));
        assert_eq!(mount["readOnly"], true, "{mount}");
        assert_eq!(host_path(mount), dir);
    }
    // A root peer's capabilities are read in the node's /proc: mounted read-only where
    // api_peer_procfs says.
    let procfs = config
        .api_peer_procfs
        .as_ref()
        .expect("api_peer_procfs set");
    let procfs = procfs.to_str().unwrap();
    let mount = mount_of(agent, procfs).unwrap_or_else(|| panic!("{procfs} is not mounted"));
    assert_eq!(mount["readOnly"], true, "{mount}");
    assert_eq!(host_path(mount), "/proc");
    let cni_state = mount_of(agent, "/var/lib/cni").expect("host-local's state dir mounted");
    assert_ne!(cni_state["readOnly"], true, "host-local's DEL writes there");
    assert_eq!(host_path(cni_state), "/var/lib/cni");
    // The root filesystem stays read-only: the mounts above are all a delegate DEL writes.
    assert_eq!(agent["securityContext"]["readOnlyRootFilesystem"], true);

    let config_mount = mount_of(agent, "/etc/ipq").unwrap();
    let volume = array(&pod["volumes"])
        .iter()
        .find(|v| v["name"] == config_mount["name"])
        .unwrap();
    assert_eq!(volume["configMap"]["name"], config_map["metadata"]["name"]);
}

#[test]
fn dashboard_matches_grafanas_published_schema() {
    let text = fs::read_to_string(deploy_path("grafana/ipq-conflicts.json")).unwrap();
    let (ok, out) = check_dashboard_schema(&text);
    assert!(
        ok,
        "the dashboard does not match @grafana/schema's Dashboard:\n{out}"
    );

    // The check can fail: an unknown key is caught, and so is a wrong type.
    type Mutation = fn(&mut Value);
    let mutations: [(Mutation, &str); 2] = [
        (
            |d| d["schemaVersionTypo"] = Value::from(39),
            "schemaVersionTypo",
        ),
        (
            |d| d["panels"][1]["gridPos"]["w"] = Value::from("wide"),
            "not assignable to type 'number'",
        ),
    ];
    for (mutate, error) in mutations {
        let mut broken: Value = serde_json::from_str(&text).unwrap();
        mutate(&mut broken);
        let (ok, out) = check_dashboard_schema(&broken.to_string());
        assert!(!ok && out.contains(error), "expected {error:?}:\n{out}");
    }
}

#[test]
fn dashboard_panels_explain_themselves_and_follow_the_variables() {
    let dashboard = dashboard();
    assert!(dashboard["schemaVersion"].as_u64().unwrap() >= 39);
    let variables = array(&dashboard["templating"]["list"]);
    let datasource = variables
        .iter()
        .find(|v| v["name"] == "datasource")
        .unwrap();
    assert_eq!(
        (&datasource["type"], &datasource["query"]),
        (&Value::from("datasource"), &Value::from("prometheus"))
    );
    let node = variables.iter().find(|v| v["name"] == "node").unwrap();
    assert!(node["query"]["query"]
        .as_str()
        .unwrap()
        .contains("ipq_build_info"));

    let mut titles = BTreeSet::new();
    for panel in array(&dashboard["panels"])
        .iter()
        .filter(|p| p["type"] != "row")
    {
        let title = string(&panel["title"]);
        titles.insert(title.to_owned());
        assert!(
            panel["description"].as_str().unwrap_or_default().len() > 100,
            "{title}: no description"
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = array(&panel["targets"]);
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            let expr = string(&target["expr"]);
            let found = selectors(expr);
            assert!(!found.is_empty(), "{title}: {expr} reads no ipq metric");
            for selector in found {
                assert!(
                    selector.node_filtered,
                    "{title}: {} ignores $node in {expr}",
                    selector.name
                );
            }
        }
    }
    let exprs = dashboard_exprs(&dashboard).join("\n");
    for metric in [
        "ipq_conflicts_total",
        "ipq_dropped_packets_total",
        "ipq_addresses",
        "ipq_stale_traffic_age_seconds_bucket",
        "ipq_quarantine_duration_seconds_bucket",
        "ipq_refused_claims_total",
        "ipq_datapath_interfaces",
        "ipq_events_lost_total",
        "ipq_netlink_resyncs_total",
        "ipq_registry_full_rejections_total",
        "ipq_conntrack_entries_flushed_total",
        "ipq_neighbours_flushed_total",
        "ipq_announcements_total",
        "ipq_hygiene_failures_total",
        "ipq_datapath_attachments_lost_total",
        "ipq_ipam_held_addresses",
        "ipq_ipam_releases_total",
        "ipq_ipam_failing_releases",
        "ipq_ipam_exhausted_total",
    ] {
        assert!(exprs.contains(metric), "no panel shows {metric}");
    }
    let stale = array(&dashboard["panels"])
        .iter()
        .find(|p| p["type"] == "heatmap")
        .unwrap();
    assert!(string(&stale["description"]).contains("evidence for choosing `cooldown`"));
}

/// Privileged: the real agent in a lab, scraped once.
#[test]
fn every_metric_the_dashboard_and_alerts_name_is_exported_by_the_agent() {
    let lab = Lab::new().expect("lab");
    let agent = lab.start_agent(&[]).expect("agent");
    let scrape = Scrape::parse(&agent.metrics().unwrap()).unwrap();

    let rules = &yaml_documents(&deploy_path("prometheus/ipq-rules.yaml"))[0];
    let alert_exprs: Vec<String> = alert_rules(rules)
        .iter()
        .map(|r| string(&r["expr"]).to_owned())
        .collect();
    let mut exprs = dashboard_exprs(&dashboard());
    exprs.extend(alert_exprs);
    let mut checked = BTreeSet::new();
    for expr in &exprs {
        for selector in selectors(expr) {
            let series: Vec<_> = scrape
                .0
                .iter()
                .filter(|s| s.name == selector.name)
                .collect();
            assert!(
                !series.is_empty(),
                "{} (in {expr}) is not in the agent's /metrics",
                selector.name
            );
            for (label, value) in &selector.equal {
                // job and instance come from Prometheus' scrape, not from the agent.
                if label == "job" || label == "instance" {
                    continue;
                }
                assert!(
                    series.iter().any(|s| s.labels.get(label) == Some(value)),
                    "{}{{{label}=\"{value}\"}} (in {expr}) is not in the agent's /metrics",
                    selector.name
                );
            }
            checked.insert(selector.name);
        }
    }
    assert!(checked.len() >= 12, "only {checked:?} checked");
}

#[test]
fn dockerfile_copies_what_the_repository_has_and_ships_the_workspace_binaries() {
    let dockerfile = fs::read_to_string(deploy_path("docker/Dockerfile")).unwrap();
    let mut shipped = BTreeSet::new();
    let mut copied = BTreeSet::new();
    for line in dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("COPY "))
    {
        let words: Vec<&str> = line.split_whitespace().skip(1).collect();
        let (flags, paths): (Vec<&str>, Vec<&str>) =
            words.iter().partition(|w| w.starts_with("--"));
        let (dest, sources) = paths.split_last().expect("COPY has a destination");
        if flags.iter().any(|f| f.starts_with("--from=")) {
            for source in sources {
                let name = source
                    .strip_prefix("/out/")
                    .expect("copied from the build stage's /out");
                // Fails unless `cargo build -p ipq -p ipq-cni -p ipq-cli --bins` built a binary of
                // that name.
                ipq_tests::netns::workspace_binary(name);
                // The build stage puts there what `cargo xtask build` built for the target.
                assert!(
                    dockerfile.contains(&format!("target/$triple/release/{name}")),
                    "the build stage does not put {name} in /out"
                );
                assert_eq!(*dest, "/usr/local/bin/");
                shipped.insert(name.to_owned());
            }
        } else {
            for source in sources {
                assert!(
                    repo().join(source).exists(),
                    "COPY {source}: not in the repository"
                );
                copied.insert(source.to_string());
            }
        }
    }
    // cargo reads every member's manifest to load the workspace: a crate added to it and not
    // to the image fails the image's build.
    let workspace = fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let members = workspace
        .lines()
        .find_map(|l| l.strip_prefix("members = ["))
        .expect("Cargo.toml lists the workspace's members on one line");
    let members: Vec<&str> = members.split('"').skip(1).step_by(2).collect();
    assert!(members.contains(&"agent"), "{members:?}");
    for member in members {
        assert!(
            copied.contains(member),
            "the Dockerfile does not COPY the workspace member {member}"
        );
    }
    assert_eq!(
        shipped,
        BTreeSet::from([
            "ipq".into(),
            "ipq-agent".into(),
            "ipq-cni".into(),
            "ipq-ipam".into()
        ])
    );

    // Multi-arch without emulation: the build stage runs on the builder's platform and
    // cross-compiles for each target platform buildx asks for.
    assert!(
        dockerfile.contains("FROM --platform=$BUILDPLATFORM rust:"),
        "the build stage must run on the builder's platform"
    );
    assert!(dockerfile.contains("ARG TARGETARCH"));
    assert!(dockerfile.contains(r#"cargo xtask build --arch "$TARGETARCH" --release --locked"#));
    for (arch, triple) in [
        ("amd64", "x86_64-unknown-linux-gnu"),
        ("arm64", "aarch64-unknown-linux-gnu"),
    ] {
        assert!(
            dockerfile.contains(&format!("{arch}) triple={triple} ;;")),
            "the build stage does not map TARGETARCH {arch} to {triple}"
        );
    }

    // What the DaemonSet runs is what the image ships.
    let ds = manifest("DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    for (list, name) in [("containers", "agent"), ("initContainers", "install-cni")] {
        let program = string(&container(pod, list, name)["command"][0]);
        assert!(
            shipped.contains(program),
            "{name} runs {program}, which the image does not ship"
        );
    }
    let install = container(pod, "initContainers", "install-cni");
    assert!(array(&install["command"])
        .iter()
        .any(|a| a == "--binary=/usr/local/bin/ipq-cni"));
}

#[test]
fn the_install_step_chains_ipq_cni_into_a_real_conflist_and_refuses_a_broken_one() {
    let node = TempDir::new("ipq-deploy-cni");
    let (conf, bin) = (node.0.join("net.d"), node.0.join("bin"));
    fs::create_dir_all(&conf).unwrap();
    fs::create_dir_all(&bin).unwrap();
    let calico = repo().join("tests/fixtures/conflists/10-calico.conflist");
    let original = fs::read_to_string(&calico).unwrap();
    fs::write(conf.join("10-calico.conflist"), &original).unwrap();
    let plugin = ipq_tests::netns::workspace_binary("ipq-cni");
    let ipq_cni_with = |verb: &str, extra: &[&str]| {
        let mut cmd = Command::new(&plugin);
        cmd.arg(verb)
            .arg(format!("--cni-conf-dir={}", conf.display()))
            .arg(format!("--cni-bin-dir={}", bin.display()))
            .args(extra);
        let out = cmd.output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let ipq_cni = |verb: &str| ipq_cni_with(verb, &[]);

    let (ok, out) = ipq_cni("install");
    assert!(ok, "{out}");
    assert_eq!(
        fs::read(bin.join("ipq-cni")).unwrap(),
        fs::read(&plugin).unwrap(),
        "the running binary is copied"
    );
    let installed: Value =
        serde_json::from_str(&fs::read_to_string(conf.join("10-calico.conflist")).unwrap())
            .unwrap();
    assert_eq!(
        array(&installed["plugins"]).last().unwrap()["type"],
        "ipq-cni"
    );
    let (ok, out) = ipq_cni("install");
    assert!(ok && out.contains("nothing changed"), "{out}");
    let (ok, out) = ipq_cni("uninstall");
    assert!(ok, "{out}");
    assert_eq!(
        fs::read_to_string(conf.join("10-calico.conflist")).unwrap(),
        original
    );

    // --hold-ipam: calico-ipam becomes ipq-ipam's delegate, ipq-ipam (beside the running
    // binary) goes into the bin dir, and uninstall gives the file back.
    let (ok, out) = ipq_cni_with("install", &["--hold-ipam"]);
    assert!(ok && out.contains("ipq-ipam"), "{out}");
    let held: Value =
        serde_json::from_str(&fs::read_to_string(conf.join("10-calico.conflist")).unwrap())
            .unwrap();
    let ipam = &array(&held["plugins"])[0]["ipam"];
    assert_eq!(ipam["type"], "ipq-ipam");
    assert_eq!(ipam["delegate"]["type"], "calico-ipam");
    assert_eq!(
        fs::read(bin.join("ipq-ipam")).unwrap(),
        fs::read(ipq_tests::netns::workspace_binary("ipq-ipam")).unwrap()
    );
    let (ok, out) = ipq_cni("uninstall");
    assert!(ok, "{out}");
    assert_eq!(
        fs::read_to_string(conf.join("10-calico.conflist")).unwrap(),
        original
    );

    fs::write(conf.join("10-calico.conflist"), "{\n  // hand-edited\n}\n").unwrap();
    let (ok, out) = ipq_cni("install");
    assert!(!ok, "a broken conflist must fail the init step: {out}");
    assert!(
        out.contains("10-calico.conflist") && out.contains("left untouched"),
        "{out}"
    );
}
