//! Runs a CNI plugin chain the way a runtime does: each plugin binary found on `CNI_PATH`, run
//! with the `CNI_*` environment and its config on stdin (the list's `name` and `cniVersion`
//! injected, `prevResult` the previous plugin's output on ADD, the ADD's result on CHECK and
//! DEL), DEL in reverse order, and a failed ADD undone by a DEL of the whole chain.
//!
//! Plugins run inside a network namespace of the test (normally the lab's node), entered with
//! `setns` only, so host-side veths and bridges are created there and never in the machine's
//! own namespace.

use std::{
    fmt,
    io::Write as _,
    path::{Path, PathBuf},
    process::Stdio,
};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::netns::{workspace_binary, NetNs};

/// Where the Debian `containernetworking-plugins` package installs its plugins.
pub const DEBIAN_PLUGIN_DIR: &str = "/usr/lib/cni";

/// One container's attachment to the network: the `CNI_*` variables that name it.
#[derive(Clone, Debug)]
pub struct Attachment {
    pub container_id: String,
    /// `CNI_NETNS`: a path such as `/run/netns/<name>`.
    pub netns: PathBuf,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, e.g. `IgnoreUnknown=1;IP=10.1.0.5;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p`.
    pub args: Option<String>,
}

impl Attachment {
    /// `eth0` in `ns`, with container id `id`.
    pub fn new(id: impl Into<String>, ns: &NetNs) -> Attachment {
        Attachment {
            container_id: id.into(),
            netns: Path::new("/run/netns").join(ns.name()),
            ifname: "eth0".into(),
            args: None,
        }
    }

    pub fn with_args(mut self, args: impl Into<String>) -> Attachment {
        self.args = Some(args.into());
        self
    }
}

/// A plugin that exited non-zero, with the CNI error it printed (if it printed one).
#[derive(Clone, Debug)]
pub struct PluginError {
    pub plugin: String,
    pub command: String,
    /// The error object's `code`, when stdout held one.
    pub code: Option<u64>,
    pub msg: String,
    /// What it printed (boxed: results of plugin runs stay small).
    pub output: Box<Output>,
}

/// A plugin's stdout and stderr.
#[derive(Clone, Debug, Default)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} failed (code {:?}): {}; stdout {:?}, stderr {:?}",
            self.plugin,
            self.command,
            self.code,
            self.msg,
            self.output.stdout.trim(),
            self.output.stderr.trim()
        )
    }
}

impl std::error::Error for PluginError {}

/// A network configuration list, run in one namespace.
pub struct Chain<'ns> {
    pub name: String,
    pub cni_version: String,
    /// The `plugins` entries, in ADD order.
    pub plugins: Vec<Value>,
    /// `CNI_PATH`: where plugin binaries (and the IPAM plugins they delegate to) are found.
    pub path: Vec<PathBuf>,
    netns: &'ns NetNs,
}

impl<'ns> Chain<'ns> {
    /// A chain whose plugins run inside `netns`, found in [`DEBIAN_PLUGIN_DIR`] and next to
    /// the workspace's `ipq-cni`. Fails, naming the package, when the Debian plugins are
    /// missing.
    pub fn new(
        netns: &'ns NetNs,
        name: impl Into<String>,
        cni_version: impl Into<String>,
        plugins: Vec<Value>,
    ) -> anyhow::Result<Chain<'ns>> {
        let debian = PathBuf::from(DEBIAN_PLUGIN_DIR);
        for plugin in ["bridge", "ptp", "host-local"] {
            if !debian.join(plugin).is_file() {
                bail!(
                    "{}/{plugin} is missing: install containernetworking-plugins \
                     (cargo xtask setup does)",
                    debian.display()
                );
            }
        }
        let ipq_cni = workspace_binary("ipq-cni");
        let workspace_bin = ipq_cni
            .parent()
            .context("ipq-cni has a parent directory")?
            .to_owned();
        Ok(Chain {
            name: name.into(),
            cni_version: cni_version.into(),
            plugins,
            path: vec![debian, workspace_bin],
            netns,
        })
    }

    /// The binary of plugin `kind` on `CNI_PATH`.
    fn binary(&self, kind: &str) -> anyhow::Result<PathBuf> {
        self.path
            .iter()
            .map(|dir| dir.join(kind))
            .find(|p| p.is_file())
            .with_context(|| format!("no plugin {kind:?} on CNI_PATH {:?}", self.path))
    }

    /// Plugin `index`'s config as the runtime passes it: `name` and `cniVersion` of the list,
    /// plus `prevResult` when given.
    pub fn plugin_config(&self, index: usize, prev_result: Option<&Value>) -> Value {
        let mut conf = self.plugins[index].clone();
        conf["name"] = json!(self.name);
        conf["cniVersion"] = json!(self.cni_version);
        if let Some(prev) = prev_result {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    /// Runs plugin `index` for `command` on `attachment`; its stdout on success.
    pub fn exec(
        &self,
        index: usize,
        command: &str,
        attachment: &Attachment,
        prev_result: Option<&Value>,
    ) -> Result<String, PluginError> {
        let conf = self.plugin_config(index, prev_result);
        self.exec_config(command, Some(attachment), &conf)
    }

    /// Runs the plugin named by `conf["type"]` with `conf` on stdin, as `command`, for
    /// `attachment` (none for GC, STATUS, VERSION).
    pub fn exec_config(
        &self,
        command: &str,
        attachment: Option<&Attachment>,
        conf: &Value,
    ) -> Result<String, PluginError> {
        let kind = conf["type"].as_str().unwrap_or_default().to_owned();
        self.exec_plugin(&kind, command, attachment, conf)
    }

    /// Runs plugin `kind` with `conf` on stdin, as `command`, for `attachment`: how a main
    /// plugin runs its IPAM plugin with its own whole config.
    pub fn exec_plugin(
        &self,
        kind: &str,
        command: &str,
        attachment: Option<&Attachment>,
        conf: &Value,
    ) -> Result<String, PluginError> {
        let kind = kind.to_owned();
        let fail = |msg: String| PluginError {
            plugin: kind.clone(),
            command: command.to_owned(),
            code: None,
            msg,
            output: Box::default(),
        };
        let binary = self.binary(&kind).map_err(|e| fail(format!("{e:#}")))?;
        let path = std::env::join_paths(&self.path).map_err(|e| fail(e.to_string()))?;
        let mut cmd = self.netns.command(&binary);
        cmd.env_clear()
            .env("CNI_COMMAND", command)
            .env("CNI_PATH", path)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(a) = attachment {
            cmd.env("CNI_CONTAINERID", &a.container_id)
                .env("CNI_NETNS", &a.netns)
                .env("CNI_IFNAME", &a.ifname);
            if let Some(args) = &a.args {
                cmd.env("CNI_ARGS", args);
            }
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| fail(format!("starting {}: {e}", binary.display())))?;
        let stdin = conf.to_string();
        if let Some(mut pipe) = child.stdin.take() {
            // A plugin may exit without reading its config (VERSION, an early error): its
            // answer on stdout is what counts, not a broken pipe here.
            let _ = pipe.write_all(stdin.as_bytes());
        }
        let out = child
            .wait_with_output()
            .map_err(|e| fail(format!("waiting for {}: {e}", binary.display())))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() {
            return Ok(stdout);
        }
        let error: Option<Value> = serde_json::from_str(&stdout).ok();
        Err(PluginError {
            plugin: kind,
            command: command.to_owned(),
            code: error.as_ref().and_then(|e| e["code"].as_u64()),
            msg: error
                .as_ref()
                .and_then(|e| e["msg"].as_str())
                .map(str::to_owned)
                .unwrap_or_else(|| format!("exited {}", out.status)),
            output: Box::new(Output { stdout, stderr }),
        })
    }

    /// ADD through the whole chain; the last plugin's result. When a plugin fails, the chain
    /// is DELeted in reverse order (as runtimes do; DEL errors only logged) and the failure
    /// returned.
    pub fn add(&self, attachment: &Attachment) -> Result<Value, PluginError> {
        let mut prev: Option<Value> = None;
        for index in 0..self.plugins.len() {
            let outcome = self
                .exec(index, "ADD", attachment, prev.as_ref())
                .and_then(|stdout| {
                    serde_json::from_str::<Value>(&stdout).map_err(|e| PluginError {
                        plugin: self.plugins[index]["type"].to_string(),
                        command: "ADD".into(),
                        code: None,
                        msg: format!("result is not JSON: {e}"),
                        output: Box::new(Output {
                            stdout: stdout.clone(),
                            stderr: String::new(),
                        }),
                    })
                });
            match outcome {
                Ok(result) => prev = Some(result),
                Err(err) => {
                    if let Err(e) = self.del(attachment, None) {
                        eprintln!("cleanup after a failed ADD: {e}");
                    }
                    return Err(err);
                }
            }
        }
        Ok(prev.unwrap_or(Value::Null))
    }

    /// CHECK through the whole chain with the ADD's `result`.
    pub fn check(&self, attachment: &Attachment, result: &Value) -> Result<(), PluginError> {
        for index in 0..self.plugins.len() {
            self.exec(index, "CHECK", attachment, Some(result))?;
        }
        Ok(())
    }

    /// DEL through the whole chain, last plugin first, with the ADD's `result` when known.
    pub fn del(&self, attachment: &Attachment, result: Option<&Value>) -> Result<(), PluginError> {
        for index in (0..self.plugins.len()).rev() {
            self.exec(index, "DEL", attachment, result)?;
        }
        Ok(())
    }
}

/// The host-side interface a result names: the one without a sandbox that is not `bridge`.
pub fn host_interface(result: &Value, bridge: Option<&str>) -> anyhow::Result<String> {
    let names: Vec<&str> = result["interfaces"]
        .as_array()
        .context("result has interfaces")?
        .iter()
        .filter(|i| {
            i.get("sandbox")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
        })
        .filter_map(|i| i["name"].as_str())
        .filter(|n| Some(*n) != bridge)
        .collect();
    match names[..] {
        [one] => Ok(one.to_owned()),
        _ => bail!("expected one host-side interface in {result}, found {names:?}"),
    }
}

/// The addresses (without prefix) of a result's `ips`.
pub fn addresses(result: &Value) -> anyhow::Result<Vec<std::net::IpAddr>> {
    result["ips"]
        .as_array()
        .context("result has ips")?
        .iter()
        .map(|ip| {
            let text = ip["address"].as_str().context("ips entry has an address")?;
            let addr = text.split('/').next().unwrap_or(text);
            addr.parse()
                .with_context(|| format!("address {text:?} in {result}"))
        })
        .collect()
}

/// The IPAM section `delegate` wrapped by `ipq-ipam`, which hands its releases to the agent on
/// `socket` (spooled under `state_dir`).
pub fn ipq_ipam(delegate: Value, socket: &Path, state_dir: &Path) -> Value {
    json!({
        "type": "ipq-ipam",
        "delegate": delegate,
        "socket": socket,
        "stateDir": state_dir,
        "timeoutMs": 2000,
    })
}

/// The addresses host-local holds for network `network` in `data_dir` (one file per address,
/// named by it, whose first line is the container id), with that container id.
pub fn host_local_allocations(
    data_dir: &Path,
    network: &str,
) -> anyhow::Result<std::collections::BTreeMap<std::net::IpAddr, String>> {
    let dir = data_dir.join(network);
    let mut out = std::collections::BTreeMap::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {}", dir.display()))),
    };
    for entry in entries {
        let entry = entry?;
        // Besides the addresses: `lock` and `last_reserved_ip.<range set>`.
        let Ok(addr) = entry.file_name().to_string_lossy().parse() else {
            continue;
        };
        let body = std::fs::read_to_string(entry.path())?;
        let id = body.lines().next().unwrap_or_default().trim().to_owned();
        out.insert(addr, id);
    }
    Ok(out)
}

/// The agent's API, from the test's side.
pub struct AgentApi {
    pub client: ipq::api::client::Client,
    pub runtime: tokio::runtime::Runtime,
}

/// Long enough for a veth's removal to reach the agent through netlink on a loaded machine.
const AGENT_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

impl AgentApi {
    /// The API of the agent `lab` runs.
    pub fn new(lab: &crate::lab::Lab) -> anyhow::Result<AgentApi> {
        Ok(AgentApi {
            client: ipq::api::client::Client::new(
                lab.work_dir().join("ipq.sock"),
                std::time::Duration::from_secs(5),
            ),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    /// `addr` as the agent has it; None when Free.
    pub fn get(
        &self,
        addr: std::net::IpAddr,
    ) -> anyhow::Result<Option<ipq::api::model::AddressView>> {
        match self.runtime.block_on(self.client.get(addr)) {
            Ok(view) => Ok(Some(view)),
            Err(e) if e.code() == Some(ipq::api::model::ErrorCode::NotFound) => Ok(None),
            Err(e) => Err(anyhow::Error::new(e).context(format!("GET /v1/addresses/{addr}"))),
        }
    }

    /// Returns once the agent has taken every netlink event the kernel sent before this call:
    /// a veth pair named like a workload interface (`veth*`) is created in `node` and waited
    /// for in `ipq status` (the agent reads its netlink socket in order), then removed. What a
    /// test asserts did not happen after it would have happened by then.
    pub fn netlink_barrier(&self, node: &crate::netns::NetNs) -> anyhow::Result<()> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("vethbar{n}");
        let peer = format!("ipqbar{n}");
        node.ip(&["link", "add", &name, "type", "veth", "peer", "name", &peer])?;
        let seen = crate::lab::poll(&format!("{name} in ipq status"), AGENT_SETTLE, || {
            let status = self.runtime.block_on(self.client.status())?;
            Ok(status
                .interfaces
                .iter()
                .any(|i| i.name == name)
                .then_some(()))
        });
        node.ip(&["link", "del", &name])?;
        seen
    }

    /// Waits until `addr` is in `state` and returns its view.
    pub fn wait_state(
        &self,
        addr: std::net::IpAddr,
        state: ipq::registry::StateName,
    ) -> anyhow::Result<ipq::api::model::AddressView> {
        crate::lab::poll(&format!("{addr} {state}"), AGENT_SETTLE, || {
            Ok(self.get(addr)?.filter(|v| v.state == state))
        })
    }
}
