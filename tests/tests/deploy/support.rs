//! Helpers of the deploy tests: where the artifacts and the checkers are, reading YAML and
//! JSON, and the metric selectors of PromQL expressions.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// The Debian package that ships promtool, and the PyPI / npm packages of the other checkers.
pub const PROMTOOL: &str = "the Debian package `prometheus` (promtool)";
pub const KUBERNETES_VALIDATE: &str = "kubernetes-validate (PyPI)";
pub const GRAFANA_SCHEMA: &str = "@grafana/schema and typescript (npm)";

/// The Kubernetes version the manifests are validated against (one whose schemas the pinned
/// kubernetes-validate ships).
pub const KUBERNETES_VERSION: &str = "1.33.0";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_owned()
}

pub fn deploy_path(rel: &str) -> PathBuf {
    repo().join("deploy").join(rel)
}

/// A checker `cargo xtask setup` installs under `target/tools/`; fails naming it if missing.
pub fn installed_tool(rel: &str, package: &str) -> PathBuf {
    let path = repo().join("target/tools").join(rel);
    assert!(
        path.is_file(),
        "{} is missing: these tests need {package}; install it with `cargo xtask setup`",
        path.display()
    );
    path
}

/// Runs `cmd`; whether it succeeded, and its stdout and stderr. A program that cannot be
/// started fails the test naming `package`.
pub fn run(cmd: &mut Command, package: &str) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run {:?} ({e}): these tests need {package}; install it with `cargo xtask \
             setup`",
            cmd.get_program()
        )
    });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The documents of a YAML file as JSON, read with PyYAML from kubernetes-validate's venv.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let python = installed_tool("venv/bin/python3", KUBERNETES_VALIDATE);
    let script = "import json, sys, yaml\n\
                  print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))";
    let (ok, out) = run(
        Command::new(python).args(["-c", script]).arg(path),
        KUBERNETES_VALIDATE,
    );
    assert!(ok, "{} is not valid YAML:\n{out}", path.display());
    serde_json::from_str(&out).expect("PyYAML's JSON")
}

pub fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(deploy_path("kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// The one manifest of `kind`.
pub fn manifest(kind: &str) -> Value {
    let mut found: Vec<Value> = manifest_files()
        .iter()
        .flat_map(|f| yaml_documents(f))
        .filter(|d| d["kind"] == kind)
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind} in deploy/kubernetes");
    found.remove(0)
}

pub fn array(value: &Value) -> &Vec<Value> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
}

pub fn array_or_empty(value: &Value) -> &[Value] {
    value.as_array().map_or(&[], Vec::as_slice)
}

pub fn string(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

/// The container `name` of the pod spec's `list` (`containers` or `initContainers`).
pub fn container<'a>(pod: &'a Value, list: &str, name: &str) -> &'a Value {
    array(&pod[list])
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {list} entry named {name}"))
}

pub fn mount_of<'a>(container: &'a Value, path: &str) -> Option<&'a Value> {
    array_or_empty(&container["volumeMounts"])
        .iter()
        .find(|m| m["mountPath"] == path)
}

/// Every alerting rule of a rules file.
pub fn alert_rules(rules: &Value) -> Vec<&Value> {
    array(&rules["groups"])
        .iter()
        .flat_map(|g| array(&g["rules"]))
        .filter(|r| r.get("alert").is_some())
        .collect()
}

pub fn dashboard() -> Value {
    let text = fs::read_to_string(deploy_path("grafana/ipq-conflicts.json")).unwrap();
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// Every PromQL expression of the dashboard: panel queries and the `node` variable's.
pub fn dashboard_exprs(dashboard: &Value) -> Vec<String> {
    let panels = array(&dashboard["panels"])
        .iter()
        .flat_map(|p| array_or_empty(&p["targets"]))
        .map(|t| string(&t["expr"]).to_owned());
    let variables = array(&dashboard["templating"]["list"])
        .iter()
        .filter_map(|v| v["query"]["query"].as_str().map(str::to_owned));
    panels.chain(variables).collect()
}

/// One `ipq_*` metric selector of a PromQL expression.
#[derive(Debug)]
pub struct Selector {
    pub name: String,
    /// Its `label="value"` matchers.
    pub equal: Vec<(String, String)>,
    /// Whether it has `instance=~"$node"`.
    pub node_filtered: bool,
}

/// The `ipq_*` metric selectors of `expr` (in `label_values(ipq_x, instance)` too).
pub fn selectors(expr: &str) -> Vec<Selector> {
    let bytes = expr.as_bytes();
    let is_name = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(offset) = expr[i..].find("ipq_") {
        let start = i + offset;
        let mut end = start;
        while end < bytes.len() && is_name(bytes[end]) {
            end += 1;
        }
        i = end;
        if start > 0 && is_name(bytes[start - 1]) {
            continue;
        }
        let mut selector = Selector {
            name: expr[start..end].to_owned(),
            equal: Vec::new(),
            node_filtered: false,
        };
        if let Some(body) = expr[end..].strip_prefix('{') {
            let close = body.find('}').expect("matchers end with }");
            for matcher in body[..close].split(',').map(str::trim) {
                let op_at = matcher.find(['=', '!']).expect("label, operator, value");
                let label = matcher[..op_at].trim();
                let rest = &matcher[op_at..];
                let op_len = if rest.starts_with("=~") || rest.starts_with("!") {
                    2
                } else {
                    1
                };
                let value = rest[op_len..].trim().trim_matches('"');
                match &rest[..op_len] {
                    "=" => selector.equal.push((label.to_owned(), value.to_owned())),
                    "=~" if label == "instance" && value == "$node" => {
                        selector.node_filtered = true
                    }
                    _ => {}
                }
            }
            i = end + 1 + close;
        }
        out.push(selector);
    }
    out
}

/// Type-checks `dashboard_json` against `Dashboard` from @grafana/schema with `tsc --strict`:
/// whether it passed, and tsc's output.
pub fn check_dashboard_schema(dashboard_json: &str) -> (bool, String) {
    let tsc = installed_tool("grafana-schema/node_modules/.bin/tsc", GRAFANA_SCHEMA);
    let dir = repo().join("target/tools/grafana-schema");
    // A file of its own per call: tests run in parallel, and so may other checkouts' tests.
    let file = dir.join(format!(
        "check-{}-{}.ts",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let source = format!(
        "import type {{ Dashboard }} from \"@grafana/schema\";\n\
         // Dashboard JSON spells enum values as plain strings (\"absolute\"), which TypeScript's\n\
         // string enums do not accept: check against the same type with each string enum\n\
         // replaced by the union of its values. Required fields, unknown keys and all other\n\
         // types are checked as Grafana publishes them.\n\
         type Json<T> = T extends string ? `${{T}}` : T extends object ? {{ [K in keyof T]: Json<T[K]> }} : T;\n\
         const dashboard: Json<Dashboard> = {dashboard_json};\n\
         export default dashboard;\n"
    );
    fs::write(&file, source).unwrap();
    let result = run(
        Command::new(tsc)
            .args([
                "--noEmit",
                "--strict",
                "--target",
                "es2020",
                "--moduleResolution",
                "node",
            ])
            .arg(&file)
            .current_dir(&dir),
        GRAFANA_SCHEMA,
    );
    let _ = fs::remove_file(&file);
    result
}

static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A scratch directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
