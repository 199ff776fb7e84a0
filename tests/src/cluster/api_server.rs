//! The cluster tier's control plane alone: no kubelet, no containerd, no image. An API server
//! with ipq's NodeQuarantine CRD, namespace, ServiceAccount and RBAC applied from
//! `deploy/kubernetes/` as users apply them, a Node object for the agent's node, the agent's
//! credentials as the DaemonSet's pod has them (a token of the `ipq-agent` ServiceAccount), and
//! a way in from a lab's network namespace, where an agent driven through its API runs.
//!
//! What the NodeQuarantine publisher needs, at a fraction of a whole cluster's start: the
//! refused-write test and `cargo xtask bench --only publish` use it.

use std::{
    fs,
    io::{BufRead as _, BufReader},
    net::{Shutdown, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use super::{
    control_plane::{ControlPlane, APISERVER_URL},
    deploy::{manifests_dir, NAMESPACE},
    host::Host,
    kubectl::Kubectl,
    pki::Pki,
};
use crate::netns::NetNs;

/// The manifests of `deploy/kubernetes/` the agent's API access needs (the ConfigMap and the
/// DaemonSet are the node's: without a kubelet nothing would run them).
const API_MANIFESTS: [&str; 4] = [
    "00-namespace.yaml",
    "05-nodequarantine-crd.yaml",
    "10-serviceaccount.yaml",
    "15-rbac.yaml",
];
/// The manifest whose ClusterRoleBinding gives the agent its rights.
pub const RBAC_MANIFEST: &str = "15-rbac.yaml";
pub const CLUSTER_ROLE_BINDING: &str = "ipq-agent";
/// The ServiceAccount the DaemonSet's pods run as (`10-serviceaccount.yaml`).
const SERVICE_ACCOUNT: &str = "ipq-agent";
/// The writes the agent's publisher makes, as (verb, NodeQuarantine subresource).
const AGENT_WRITES: [(&str, Option<&str>); 3] =
    [("create", None), ("patch", None), ("patch", Some("status"))];

/// A running control plane with ipq's API objects; dropping it stops everything.
pub struct ApiServer {
    /// Stopped first: it dials the API server.
    forwards: Vec<Forward>,
    control_plane: ControlPlane,
    pub host: Host,
    ca: PathBuf,
    /// The Node object the agent's NodeQuarantine is owned by.
    pub node: String,
}

impl ApiServer {
    /// Starts etcd, the API server, the controller manager and the scheduler, applies ipq's
    /// API manifests, waits until the CRD is served, and makes the Node `node`.
    pub fn start(node: &str) -> anyhow::Result<ApiServer> {
        let host = Host::create()?;
        let pki = Pki::create(
            &host.dir().join("pki"),
            &[node],
            &ControlPlane::serving_ips(),
        )?;
        let control_plane = ControlPlane::start(&host, &pki)?;
        let api = ApiServer {
            forwards: Vec::new(),
            control_plane,
            ca: pki.ca.cert.clone(),
            host,
            node: node.to_owned(),
        };
        for manifest in API_MANIFESTS {
            api.apply_manifest(manifest)?;
        }
        api.kubectl().run(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/nodequarantines.ipq.dev",
        ])?;
        api.kubectl().apply(
            &serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node},
            })
            .to_string(),
        )?;
        Ok(api)
    }

    /// kubectl as the cluster's admin.
    pub fn kubectl(&self) -> Kubectl<'_> {
        Kubectl::new(&self.host, self.control_plane.admin_kubeconfig.clone())
            .expect("kubectl was there when the control plane started")
    }

    /// `kubectl apply -f deploy/kubernetes/<manifest>`, as the README has users apply it.
    pub fn apply_manifest(&self, manifest: &str) -> anyhow::Result<()> {
        let path = manifests_dir().join(manifest);
        self.kubectl()
            .run(&["apply", "-f", &path.to_string_lossy()])?;
        Ok(())
    }

    /// Whether the API server's authorizer lets the agent's ServiceAccount `verb` the
    /// NodeQuarantines (or their `subresource`): `kubectl auth can-i --as`, a
    /// SubjectAccessReview answered by the same RBAC cache the agent's writes meet.
    pub fn agent_may(&self, verb: &str, subresource: Option<&str>) -> anyhow::Result<bool> {
        let subject = format!("--as=system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}");
        let subresource = subresource.map(|name| format!("--subresource={name}"));
        let mut args = vec!["auth", "can-i", verb, "nodequarantines", subject.as_str()];
        args.extend(subresource.as_deref());
        let mut cmd = self.kubectl().command(&args);
        let out = crate::podman::run_bounded(&mut cmd, Duration::from_secs(120))?;
        // can-i prints its answer and exits 1 for "no": only the answer is trusted.
        match String::from_utf8_lossy(&out.stdout).trim() {
            "yes" => Ok(true),
            "no" => Ok(false),
            other => bail!(
                "kubectl {}: printed {other:?}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }
    }

    /// Which of the agent's writes (verb, subresource) the API server's authorizer allows.
    pub fn agent_writes_allowed(
        &self,
    ) -> anyhow::Result<Vec<(&'static str, Option<&'static str>)>> {
        let mut allowed = Vec::new();
        for (verb, subresource) in AGENT_WRITES {
            if self.agent_may(verb, subresource)? {
                allowed.push((verb, subresource));
            }
        }
        Ok(allowed)
    }

    /// Returns once the API server's authorizer refuses every write the agent makes: a
    /// ClusterRoleBinding deleted is only in force once the API server's RBAC cache has seen
    /// the delete, which a loaded machine can delay past `kubectl`'s return.
    pub fn wait_until_agent_writes_refused(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let allowed = self.agent_writes_allowed()?;
            if allowed.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the API server's authorizer still allows the agent {allowed:?} \
                     {within:?} after the change"
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops kube-apiserver: an outage, until [`ApiServer::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.control_plane.stop_apiserver();
    }

    /// Starts kube-apiserver again; returns once it answers `/readyz`, with when the probe
    /// that saw it ready began.
    pub fn start_apiserver(&mut self) -> anyhow::Result<std::time::SystemTime> {
        self.control_plane.start_apiserver(&self.host)
    }

    /// Fails naming the first component that has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        self.control_plane.check_running()
    }

    /// The components' log tails, for an error message.
    pub fn logs(&self) -> String {
        self.control_plane.logs()
    }

    /// Writes to `path` a kubeconfig with the credentials the DaemonSet's pod has: a token of
    /// the `ipq-agent` ServiceAccount (TokenRequest, valid for `valid_for`), the cluster's CA,
    /// and the API server's URL, which [`ApiServer::reachable_from`] makes good in a lab.
    pub fn agent_kubeconfig(&self, path: &Path, valid_for: Duration) -> anyhow::Result<()> {
        let token = self.kubectl().run(&[
            "-n",
            NAMESPACE,
            "create",
            "token",
            SERVICE_ACCOUNT,
            &format!("--duration={}s", valid_for.as_secs()),
        ])?;
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: ipq
  cluster:
    server: {APISERVER_URL}
    certificate-authority: {ca}
users:
- name: ipq-agent
  user:
    token: {token}
contexts:
- name: ipq
  context:
    cluster: ipq
    user: ipq-agent
current-context: ipq
",
            ca = self.ca.display(),
            token = token.trim(),
        );
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }

    /// Makes the API server's address (127.0.0.1:6443, on the control plane's loopback) answer
    /// in `ns` too: a listener there, each connection spliced to the API server. TLS goes
    /// through untouched (the certificate names 127.0.0.1).
    pub fn reachable_from(&mut self, ns: &NetNs) -> anyhow::Result<()> {
        let addr = APISERVER_URL.trim_start_matches("https://");
        let listener = ns
            .run(|| TcpListener::bind(addr))
            .with_context(|| format!("listening on {addr} in {}", ns.name()))?;
        let upstream = Path::new("/run/netns").join(self.host.node.name());
        self.forwards
            .push(Forward::start(listener, upstream, addr)?);
        Ok(())
    }

    /// A watch of the NodeQuarantine named after the node, through kubectl as a reader of the
    /// API does (`?watch=true`): every event, with the time it was read.
    pub fn watch_node_quarantine(&self) -> anyhow::Result<Watch> {
        let path = format!(
            "/apis/ipq.dev/v1alpha1/nodequarantines?watch=true&fieldSelector=metadata.name%3D{}",
            self.node
        );
        watch_raw(&self.kubectl(), &path)
    }
}

/// A watch of the API path `path` (`?watch=true` in it) through kubectl, as a reader of the API
/// does: every event, with the time it was read. A DELETED event fails the reader's next call.
pub fn watch_raw(kubectl: &Kubectl<'_>, path: &str) -> anyhow::Result<Watch> {
    let mut cmd = kubectl.command(&["get", "--raw", path]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    crate::wait::die_with_parent(&mut cmd);
    let mut child = cmd.spawn().context("starting kubectl's watch")?;
    let stdout = child.stdout.take().context("the watch's stdout")?;
    let (events, received) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let at = Instant::now();
            let event = serde_json::from_str::<Value>(&line)
                .map_err(|e| format!("watch line {line:?}: {e}"));
            if events.send((at, event)).is_err() {
                break;
            }
        }
    });
    Ok(Watch { child, received })
}

/// A running watch; dropping it stops kubectl.
pub struct Watch {
    child: Child,
    received: mpsc::Receiver<(Instant, Result<Value, String>)>,
}

impl Watch {
    /// The next event's object and when it was read, waiting until `deadline`; `None` then.
    pub fn next_before(&mut self, deadline: Instant) -> anyhow::Result<Option<(Instant, Value)>> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.received.recv_timeout(wait) {
            Ok((at, Ok(event))) => {
                let kind = event["type"].as_str().unwrap_or_default();
                if !matches!(kind, "ADDED" | "MODIFIED") {
                    bail!("the watch sent a {kind} event: {event}");
                }
                Ok(Some((at, event["object"].clone())))
            }
            Ok((_, Err(e))) => bail!("{e}"),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait()?;
                bail!("kubectl's watch ended ({status:?})")
            }
        }
    }

    /// Waits for an object for which `done` holds, until `timeout`; the object and when.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Value) -> bool,
    ) -> anyhow::Result<(Instant, Value)> {
        let deadline = Instant::now() + timeout;
        let mut last = Value::Null;
        while let Some((at, object)) = self.next_before(deadline)? {
            if done(&object) {
                return Ok((at, object));
            }
            last = object;
        }
        bail!("{what}: not seen through the watch in {timeout:?}; last object: {last}")
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A listener in one namespace whose connections are spliced to an address in another.
struct Forward {
    stop: Arc<AtomicBool>,
    listener: Arc<TcpListener>,
}

impl Forward {
    fn start(listener: TcpListener, upstream_ns: PathBuf, addr: &str) -> anyhow::Result<Forward> {
        let listener = Arc::new(listener);
        let stop = Arc::new(AtomicBool::new(false));
        let (accepting, stopped) = (listener.clone(), stop.clone());
        let addr = addr.to_owned();
        let (ready, entered) = mpsc::channel();
        thread::spawn(move || {
            // This thread dials from the API server's namespace: every connection it makes is
            // there, whatever namespace the accepted ones come from.
            let _ = ready.send(enter_netns(&upstream_ns));
            for client in accepting.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                match TcpStream::connect(&addr) {
                    Ok(server) => splice(client, server),
                    // The client sees its connection closed, as with no API server.
                    Err(_) => drop(client),
                }
            }
        });
        entered
            .recv()
            .context("the forwarding thread ended at once")??;
        Ok(Forward { stop, listener })
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocked accept, which then sees `stop`.
        // SAFETY: shutting down a socket this struct keeps open.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

fn enter_netns(path: &Path) -> anyhow::Result<()> {
    let file = fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: a valid namespace fd; only the calling thread changes namespace.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!(
            "setns into {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Copies both ways until either side closes.
fn splice(client: TcpStream, server: TcpStream) {
    let pairs = [
        (client.try_clone(), server.try_clone()),
        (server.try_clone(), client.try_clone()),
    ];
    for pair in pairs {
        let (Ok(mut from), Ok(mut to)) = pair else {
            return;
        };
        thread::spawn(move || {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    }
}
