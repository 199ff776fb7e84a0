//! ipq's Helm chart (`deploy/helm/ipq/`): with its default values it renders what
//! `deploy/kubernetes/` holds, object by object and field by field (the two cannot drift: the
//! manifests stay hand-written, with their comments, and this test says which field of which
//! object differs); `helm lint --strict` passes with default and non-default values; and
//! non-default values (observe mode, the ServiceMonitor, the PrometheusRule, the whereabouts
//! projection, the dashboard) render manifests kubernetes-validate accepts and an agent.toml the
//! agent accepts, saying what was asked.
//!
//! helm is built from its Go module by `cargo xtask setup` (the host suite's setup runs that
//! step); a missing helm fails every test naming how to build it.

#[path = "deploy/helm.rs"]
mod helm;
#[path = "deploy/support.rs"]
#[allow(dead_code)]
mod support;

use std::{fs, process::Command};

use helm::*;
use ipq::config::{Config, Mode};
use serde_json::{json, Value};
use support::{deploy_path, run, TempDir, KUBERNETES_VALIDATE, KUBERNETES_VERSION};

/// The DaemonSet's annotation that rolls the pods when the config changes; the one field the
/// chart adds to deploy/kubernetes/.
const CHECKSUM: &str = "checksum/config";

/// Every difference between the chart's objects and `shipped`, with the Namespace left out (the
/// chart installs into the release's namespace, which `helm install --create-namespace` makes)
/// and the chart's checksum annotation taken out (asserted to be a SHA-256).
fn drift(chart: &[Value], shipped: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let shipped: Vec<&Value> = shipped
        .iter()
        .filter(|o| o["kind"] != "Namespace")
        .collect();
    for object in &shipped {
        let key = object_key(object);
        if !chart.iter().any(|o| object_key(o) == key) {
            out.push(format!(
                "{key}: in deploy/kubernetes, not rendered by the chart"
            ));
        }
    }
    for object in chart {
        let key = object_key(object);
        let Some(twin) = shipped.iter().find(|o| object_key(o) == key) else {
            out.push(format!(
                "{key}: rendered by the chart, not in deploy/kubernetes"
            ));
            continue;
        };
        let mut rendered = object.clone();
        let mut twin = (*twin).clone();
        if rendered["kind"] == "DaemonSet" {
            let annotations = rendered["spec"]["template"]["metadata"]["annotations"]
                .as_object_mut()
                .expect("the pod template has annotations");
            let checksum = annotations.remove(CHECKSUM);
            assert!(
                checksum
                    .as_ref()
                    .and_then(Value::as_str)
                    .is_some_and(|c| c.len() == 64 && c.chars().all(|c| c.is_ascii_hexdigit())),
                "{key}: the pod template's {CHECKSUM} is not a SHA-256: {checksum:?}"
            );
        }
        // The agent's config is compared as TOML data: the manifest's comments explain it, the
        // chart renders it from values.
        if rendered["data"]["agent.toml"].is_string() && twin["data"]["agent.toml"].is_string() {
            rendered["data"]["agent.toml"] = agent_toml(&rendered);
            twin["data"]["agent.toml"] = agent_toml(&twin);
        }
        differences(&key, &rendered, &twin, &mut out);
    }
    out
}

fn assert_no_drift(what: &str, chart: &[Value], shipped: &[Value]) {
    let drift = drift(chart, shipped);
    assert!(
        drift.is_empty(),
        "{what}: the chart and deploy/kubernetes/ differ:\n  {}\n{REGENERATE}",
        drift.join("\n  ")
    );
}

#[test]
fn the_default_rendering_is_deploy_kubernetes() {
    let chart = render(&[]);
    let shipped = shipped_objects("kubernetes");
    assert!(shipped.len() >= 7, "deploy/kubernetes/: {shipped:?}");
    assert_no_drift("helm template with default values", &chart, &shipped);
    assert!(
        !chart.iter().any(|o| o["kind"] == "Namespace"),
        "the chart installs into the release's namespace and makes none"
    );

    // The comparison can fail: one changed field is named with its path.
    let mut changed = chart.clone();
    let ds = changed
        .iter_mut()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    ds["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = json!("1Gi");
    let found = drift(&changed, &shipped);
    assert_eq!(
        found,
        [
            "DaemonSet/ipq-system/ipq-agent.spec.template.spec.containers[0].resources.limits.\
          memory: the chart renders \"1Gi\", deploy/kubernetes has \"256Mi\""
        ],
    );
    let config = changed
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap();
    config["data"]["agent.toml"] = json!("mode = \"observe\"\n");
    assert!(
        drift(&changed, &shipped)
            .iter()
            .any(|d| d.contains("data.agent.toml.mode: the chart renders \"observe\"")),
        "{:?}",
        drift(&changed, &shipped)
    );
}

#[test]
fn whereabouts_on_renders_deploy_kubernetes_whereabouts() {
    let chart = render(&["--set", "whereabouts.enabled=true"]);
    let mut shipped = shipped_objects("kubernetes");
    shipped.extend(shipped_objects("kubernetes/whereabouts"));
    // What docs/kubernetes.md has users add to the ConfigMap with the Role.
    let config = shipped
        .iter_mut()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap();
    let toml = config["data"]["agent.toml"].as_str().unwrap().to_owned();
    config["data"]["agent.toml"] = json!(format!("{toml}\n[kubernetes]\nwhereabouts = true\n"));
    assert_no_drift(
        "helm template --set whereabouts.enabled=true",
        &chart,
        &shipped,
    );
}

#[test]
fn the_charts_copies_are_the_shipped_files() {
    for (copy, shipped) in [
        (
            "helm/ipq/crds/nodequarantine-crd.yaml",
            "kubernetes/05-nodequarantine-crd.yaml",
        ),
        (
            "helm/ipq/files/ipq-conflicts.json",
            "grafana/ipq-conflicts.json",
        ),
        ("helm/ipq/files/ipq-rules.yaml", "prometheus/ipq-rules.yaml"),
    ] {
        assert!(
            fs::read(deploy_path(copy)).unwrap() == fs::read(deploy_path(shipped)).unwrap(),
            "deploy/{copy} differs from deploy/{shipped}, which it ships in the chart (Helm \
             reads no file outside the chart): cp deploy/{shipped} deploy/{copy}"
        );
    }
}

/// Every option of the chart away from its default, in one values file.
const NON_DEFAULT: &str = r#"
image:
  repository: registry.example.org/mirror/ipq
  tag: "0.1.0-rc1"
  pullPolicy: Always
mode: observe
onEarlyReuse: refuse-new
cooldown: 45s
capacity: 131072
interfaces:
  uplink: ["eth0"]
ipam:
  hold: true
  onExhausted: release-quietest
config:
  hygiene:
    announce_per_second: 20
  kubernetes:
    whereabouts_network_name: pods
whereabouts:
  enabled: true
  namespace: whereabouts
logLevel: debug
extraEnv:
  - name: EXTRA
    value: "1"
resources:
  agent:
    requests: {cpu: 100m, memory: 128Mi}
    limits: {memory: 512Mi}
priorityClassName: ""
nodeSelector:
  ipq.dev/enabled: "true"
tolerations:
  - key: dedicated
    operator: Equal
    value: network
    effect: NoSchedule
serviceMonitor:
  enabled: true
  interval: 15s
  labels: {release: kube-prometheus-stack}
prometheusRule:
  enabled: true
  labels: {release: kube-prometheus-stack}
dashboard:
  enabled: true
  label: grafana_dashboard_ipq
  labelValue: "yes"
  namespace: monitoring
  annotations: {grafana_folder: ipq}
"#;

#[test]
fn helm_lint_passes_with_default_and_non_default_values() {
    let (_dir, values) = values_file(NON_DEFAULT);
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    for extra in [vec![], vec!["--values", values.as_str()]] {
        let mut args = vec!["lint", "--strict", chart, "--namespace", NAMESPACE];
        args.extend(&extra);
        let (ok, out) = helm_run(&args);
        assert!(ok, "helm {}:\n{out}", args.join(" "));
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{out}"
        );
    }
}

#[test]
fn non_default_values_render_what_they_say_and_validate() {
    let (_dir, values) = values_file(NON_DEFAULT);
    let objects = render(&["--values", &values]);

    // The agent accepts the rendered config, and it says what was asked.
    let config_map = find(&objects, "ConfigMap/ipq-system/ipq-agent-config");
    let text = config_map["data"]["agent.toml"].as_str().unwrap();
    let config = Config::from_toml(text, "the chart's agent.toml")
        .unwrap_or_else(|e| panic!("the agent refuses the rendered agent.toml: {e}\n{text}"));
    assert_eq!(config.mode, Mode::Observe);
    assert_eq!(config.hygiene.announce_per_second, 20);
    assert!(config.kubernetes.whereabouts);
    assert_eq!(
        config.kubernetes.whereabouts_namespace.as_deref(),
        Some("whereabouts")
    );
    assert_eq!(config.kubernetes.whereabouts_network_name, "pods");
    let toml = agent_toml(config_map);
    assert_eq!(toml["capacity"], 131072, "{toml}");
    assert_eq!(toml["cooldown"], "45s");
    assert_eq!(toml["on_early_reuse"], "refuse-new");
    assert_eq!(toml["ipam_on_exhausted"], "release-quietest");
    assert_eq!(toml["interfaces"]["uplink"], json!(["eth0"]));
    // Keys of `config` the values did not name keep the chart's defaults (a deep merge).
    assert_eq!(toml["hygiene"]["flush"], true);
    assert_eq!(toml["tc_attach"], "auto");

    let ds = find(&objects, "DaemonSet/ipq-system/ipq-agent");
    let pod = &ds["spec"]["template"]["spec"];
    for list in ["initContainers", "containers"] {
        for container in pod[list].as_array().unwrap() {
            assert_eq!(
                container["image"], "registry.example.org/mirror/ipq:0.1.0-rc1",
                "{container}"
            );
            assert_eq!(container["imagePullPolicy"], "Always", "{container}");
        }
    }
    let install = pod["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "install-cni")
        .unwrap();
    assert!(
        install["command"]
            .as_array()
            .unwrap()
            .contains(&json!("--hold-ipam")),
        "{install}"
    );
    let agent = &pod["containers"][0];
    assert_eq!(agent["resources"]["limits"]["memory"], "512Mi");
    let env = agent["env"].as_array().unwrap();
    assert!(env.contains(&json!({"name": "RUST_LOG", "value": "debug"})));
    assert!(env.contains(&json!({"name": "EXTRA", "value": "1"})));
    assert!(pod.get("priorityClassName").is_none(), "{pod}");
    // Helm merges a map value with the default's: the OS selector stays (`null` removes it).
    assert_eq!(
        pod["nodeSelector"],
        json!({"ipq.dev/enabled": "true", "kubernetes.io/os": "linux"})
    );
    assert_eq!(pod["tolerations"][0]["key"], "dedicated");

    // Another config, another checksum: `helm upgrade` rolls the pods.
    let default_ds = render(&[])
        .into_iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    let checksum = |ds: &Value| ds["spec"]["template"]["metadata"]["annotations"][CHECKSUM].clone();
    assert_ne!(checksum(ds), checksum(&default_ds));
    // An image alone changes the pod template, not the checksum.
    let retagged = render(&["--set", "image.tag=other"])
        .into_iter()
        .find(|o| o["kind"] == "DaemonSet")
        .unwrap();
    assert_eq!(checksum(&retagged), checksum(&default_ds));

    // The whereabouts Role in whereabouts' namespace, bound to the release's service account.
    let binding = find(&objects, "RoleBinding/whereabouts/ipq-agent-whereabouts");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    find(&objects, "Role/whereabouts/ipq-agent-whereabouts");

    // The ServiceMonitor finds the Service, whose port is the agent's, as job="ipq".
    let service = find(&objects, "Service/ipq-system/ipq-agent-metrics");
    let monitor = find(&objects, "ServiceMonitor/ipq-system/ipq-agent");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    for (label, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][label], value, "{label}");
        assert_eq!(&service["spec"]["selector"][label], value, "{label}");
        assert_eq!(&pod_labels(ds)[label], value, "{label}");
    }
    let job_label = monitor["spec"]["jobLabel"].as_str().unwrap();
    assert_eq!(
        service["metadata"]["labels"][job_label], "ipq",
        "the rules' job"
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(monitor["spec"]["endpoints"][0]["interval"], "15s");
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(agent["ports"][0]["name"], "metrics");
    assert_eq!(service["spec"]["clusterIP"], "None");

    // The PrometheusRule's groups are deploy/prometheus/ipq-rules.yaml's.
    let rule = find(&objects, "PrometheusRule/ipq-system/ipq");
    let rules = &support::yaml_documents(&deploy_path("prometheus/ipq-rules.yaml"))[0];
    assert_eq!(rule["spec"], *rules);

    // The dashboard, labelled for the sidecar, in the namespace asked for.
    let dashboard = find(&objects, "ConfigMap/monitoring/ipq-dashboard");
    assert_eq!(
        dashboard["metadata"]["labels"]["grafana_dashboard_ipq"],
        "yes"
    );
    assert_eq!(
        dashboard["metadata"]["annotations"]["grafana_folder"],
        "ipq"
    );
    let json: Value =
        serde_json::from_str(dashboard["data"]["ipq-conflicts.json"].as_str().unwrap()).unwrap();
    assert_eq!(json, support::dashboard());

    // What kubernetes-validate has schemas for passes it strictly; the Prometheus Operator's
    // kinds (no schema there) are checked field by field above.
    let core: Vec<&Value> = objects
        .iter()
        .filter(|o| o["apiVersion"] != "monitoring.coreos.com/v1")
        .collect();
    assert_eq!(core.len(), objects.len() - 2);
    validate_strictly(&core);
}

#[test]
fn the_dashboards_default_sidecar_label_is_grafana_dashboard_1() {
    let objects = render(&["--set", "dashboard.enabled=true"]);
    let dashboard = find(&objects, "ConfigMap/ipq-system/ipq-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    // Nothing of the Prometheus Operator unless asked for: a cluster without its CRDs
    // installs the chart.
    assert!(!objects
        .iter()
        .any(|o| o["apiVersion"] == "monitoring.coreos.com/v1"));
}

#[test]
fn contradicting_or_unknown_values_are_refused_naming_them() {
    for (set, error) in [
        (
            "config.mode=observe",
            "config.mode is set: set mode instead",
        ),
        (
            "config.state_dir=/srv/ipq",
            "config.state_dir is set: set nothing: the DaemonSet mounts /var/lib/ipq",
        ),
        ("mode=audit", "mode"),
        ("mdoe=observe", "mdoe"),
        ("whereabouts.enabeld=true", "enabeld"),
        // A choice the agent would refuse at start (a DaemonSet crash-looping on every node)
        // is refused by the install.
        ("config.bpf_watcher=trampoline", "bpf_watcher"),
        ("config.tc_attach=tc", "tc_attach"),
    ] {
        let result = template(&["--set", set]);
        let out = result.expect_err(&format!("--set {set} was accepted"));
        assert!(
            out.contains(error),
            "--set {set}: expected {error:?} in:\n{out}"
        );
    }
    let result = template(&[
        "--set",
        "whereabouts.enabled=true",
        "--set",
        "config.kubernetes.whereabouts=false",
    ]);
    let out = result.expect_err("config.kubernetes.whereabouts was accepted");
    assert!(out.contains("set whereabouts.enabled instead"), "{out}");
}

fn pod_labels(ds: &Value) -> &Value {
    &ds["spec"]["template"]["metadata"]["labels"]
}

/// kubernetes-validate --strict over `objects` (written as one multi-document file).
fn validate_strictly(objects: &[&Value]) {
    let validate = support::installed_tool("venv/bin/kubernetes-validate", KUBERNETES_VALIDATE);
    let dir = TempDir::new("ipq-helm-validate");
    let file = dir.0.join("rendered.yaml");
    let text: Vec<String> = objects.iter().map(|o| o.to_string()).collect();
    fs::write(&file, text.join("\n---\n")).unwrap();
    let (ok, out) = run(
        Command::new(&validate)
            .args(["--strict", "--kubernetes-version", KUBERNETES_VERSION])
            .arg(&file),
        KUBERNETES_VALIDATE,
    );
    assert!(ok, "kubernetes-validate of the rendered chart:\n{out}");
    assert_eq!(
        out.matches("passed").count(),
        objects.len(),
        "every object validated:\n{out}"
    );
    assert!(!out.contains("ERROR") && !out.contains("WARN"), "{out}");
}
