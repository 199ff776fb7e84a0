//! Helpers of the Helm chart's tests: the helm binary the setup builds, rendering the chart, and
//! comparing rendered objects with `deploy/kubernetes/` as data, field by field.

use std::{fs, path::PathBuf, process::Command};

use serde_json::Value;

use super::support::{deploy_path, repo, run, yaml_documents, TempDir};

/// Where `cargo xtask setup` builds helm from `xtask/cluster/helm/` (the cluster components'
/// step, which `cargo xtask test` runs before the host suite).
pub const HELM: &str = "helm (built from xtask/cluster/helm by `cargo xtask setup`)";

/// The namespace the chart is rendered into, the one `deploy/kubernetes/` names.
pub const NAMESPACE: &str = "ipq-system";

/// How to make the chart and `deploy/kubernetes/` agree again, for a failure message.
pub const REGENERATE: &str = "deploy/kubernetes/ and the chart (deploy/helm/ipq/) must say the \
    same: change the chart's templates or values.yaml so that `target/cluster/bin/helm template \
    ipq deploy/helm/ipq -n ipq-system --include-crds` renders each object of deploy/kubernetes/ \
    as it is (comments aside), or change deploy/kubernetes/ to what the chart renders";

pub fn helm() -> PathBuf {
    let path = repo().join("target/cluster/bin/helm");
    assert!(
        path.is_file(),
        "{} is missing: these tests need {HELM}; build it with `cargo xtask setup --for cluster` \
         (or `cargo xtask setup`)",
        path.display()
    );
    path
}

pub fn chart_dir() -> PathBuf {
    deploy_path("helm/ipq")
}

/// `helm <args>` with Helm's own dirs in a scratch directory (nothing read from or written to
/// the user's ~/.config/helm): whether it succeeded, and its output.
pub fn helm_run(args: &[&str]) -> (bool, String) {
    let home = TempDir::new("ipq-helm-home");
    let mut cmd = Command::new(helm());
    cmd.args(args)
        .env("HELM_CACHE_HOME", home.0.join("cache"))
        .env("HELM_CONFIG_HOME", home.0.join("config"))
        .env("HELM_DATA_HOME", home.0.join("data"));
    run(&mut cmd, HELM)
}

/// `helm template ipq deploy/helm/ipq -n ipq-system --include-crds <args>`: its stdout, or the
/// error helm printed.
pub fn template(args: &[&str]) -> Result<String, String> {
    let chart = chart_dir();
    let mut all = vec![
        "template",
        "ipq",
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
        "--include-crds",
    ];
    all.extend(args);
    match helm_run(&all) {
        (true, out) => Ok(out),
        (false, out) => Err(out),
    }
}

/// The chart's objects rendered with `args` (values files, `--set`), parsed.
pub fn render(args: &[&str]) -> Vec<Value> {
    let text = template(args).unwrap_or_else(|e| panic!("helm template {args:?} failed:\n{e}"));
    let dir = TempDir::new("ipq-helm-render");
    let file = dir.0.join("rendered.yaml");
    fs::write(&file, text).unwrap();
    yaml_documents(&file)
}

/// Writes `values` (YAML) to a scratch file; the file and the dir that removes it on drop.
pub fn values_file(values: &str) -> (TempDir, String) {
    let dir = TempDir::new("ipq-helm-values");
    let file = dir.0.join("values.yaml");
    fs::write(&file, values).unwrap();
    let file = file.to_str().unwrap().to_owned();
    (dir, file)
}

/// `Kind/namespace/name` of an object (`-` for a cluster-scoped one).
pub fn object_key(object: &Value) -> String {
    let meta = &object["metadata"];
    format!(
        "{}/{}/{}",
        object["kind"].as_str().unwrap_or("?"),
        meta["namespace"].as_str().unwrap_or("-"),
        meta["name"].as_str().unwrap_or("?")
    )
}

/// The one object `key` of `objects`.
pub fn find<'a>(objects: &'a [Value], key: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| object_key(o) == key).collect();
    assert_eq!(
        found.len(),
        1,
        "expected one {key}, found {}: {:?}",
        found.len(),
        objects.iter().map(object_key).collect::<Vec<_>>()
    );
    found[0]
}

/// The ConfigMap's agent.toml as data.
pub fn agent_toml(config_map: &Value) -> Value {
    let text = config_map["data"]["agent.toml"]
        .as_str()
        .unwrap_or_else(|| panic!("{} has no agent.toml", object_key(config_map)));
    let table: toml::Table = text
        .parse()
        .unwrap_or_else(|e| panic!("agent.toml of {} is not TOML: {e}", object_key(config_map)));
    serde_json::to_value(table).unwrap()
}

/// Every difference between `chart` and `shipped` below `path`, one line each: the field's
/// path, and the two values (absent where one has no such field).
pub fn differences(path: &str, chart: &Value, shipped: &Value, out: &mut Vec<String>) {
    match (chart, shipped) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let at = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => differences(&at, x, y, out),
                    (Some(x), None) => out.push(format!(
                        "{at}: the chart renders {x}, deploy/kubernetes has none"
                    )),
                    (None, Some(y)) => out.push(format!(
                        "{at}: deploy/kubernetes has {y}, the chart renders none"
                    )),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                out.push(format!(
                    "{path}: the chart renders {} items, deploy/kubernetes has {}",
                    a.len(),
                    b.len()
                ));
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(format!(
            "{path}: the chart renders {a}, deploy/kubernetes has {b}"
        )),
        _ => {}
    }
}

/// The objects of `deploy/kubernetes/<dir>`'s YAML files, in file order.
pub fn shipped_objects(dir: &str) -> Vec<Value> {
    let mut files: Vec<PathBuf> = fs::read_dir(deploy_path(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files.iter().flat_map(|f| yaml_documents(f)).collect()
}
