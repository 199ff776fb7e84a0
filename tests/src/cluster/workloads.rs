//! The workloads the cluster tier and its demo run.

use super::{host::PEER_IP, node::BUSYBOX_IMAGE};

/// A Deployment of one pod whose container ignores SIGTERM and pings the peer every 200 ms
/// with `size` bytes of payload, from the node's one pod address; rolled by changing the size.
pub fn sender_deployment(size: usize) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: sender
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels: {{app: sender}}
  strategy:
    type: RollingUpdate
    # The old pod goes first (there is one address): it starts terminating, the new one is
    # created at once.
    rollingUpdate: {{maxSurge: 0, maxUnavailable: 1}}
  template:
    metadata:
      labels: {{app: sender}}
    spec:
      automountServiceAccountToken: false
      # Long: the old pod is alive, ignoring SIGTERM, for the whole scenario.
      terminationGracePeriodSeconds: 900
      containers:
        - name: sender
          image: {BUSYBOX_IMAGE}
          command:
            - /bin/sh
            - -c
            - |
              trap '' TERM
              while true; do
                ping -i 0.2 -s {size} {PEER_IP}
                sleep 0.2
              done
"#
    )
}

/// The churn's pods: bare pods (named, so each one's fate can be followed) on the pod network
/// that sleep and leave at once on SIGTERM, so that a delete reaches the CNI DEL within a
/// second.
pub fn churn_pods(names: &[String]) -> String {
    names
        .iter()
        .map(|name| {
            format!(
                r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
  labels: {{app: churn}}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  containers:
    - name: sleeper
      image: {BUSYBOX_IMAGE}
      command: [/bin/sh, -c, "trap 'exit 0' TERM; sleep 2147483647 & wait"]
"#
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// What a pinned pod's container runs until told to stop: nothing (sleeps), and leaves at once
/// on SIGTERM.
pub const SLEEPS: &str = "trap 'exit 0' TERM; sleep 2147483647 & wait";

/// A bare pod pinned to `node` (by `nodeName`: no scheduling to wait for), labelled `app`,
/// whose one container runs `script` in busybox's sh; `grace` is its
/// terminationGracePeriodSeconds. Its container is not restarted: a script that exits says
/// so in the pod's status for good.
pub fn pod_on(name: &str, node: &str, app: &str, grace: u32, script: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": grace,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["/bin/sh", "-c", script],
            }],
        },
    })
    .to_string()
}

/// A script that pings the peer every 200 ms with `size` bytes of payload (its signature at
/// the witness); `ignores_sigterm`: it stays alive, sending, until killed (a stale holder).
pub fn pinging(size: usize, ignores_sigterm: bool) -> String {
    let trap = if ignores_sigterm {
        "trap '' TERM"
    } else {
        "trap 'exit 0' TERM"
    };
    format!("{trap}; while true; do ping -i 0.2 -s {size} {PEER_IP}; sleep 1; done")
}

/// A script serving `port` with busybox's persistent `nc -ll`: every connection echoed back
/// by a `cat` of its own.
pub fn echo_server(port: u16) -> String {
    format!("trap 'exit 0' TERM; nc -ll -p {port} -e /bin/cat & wait")
}

/// Where [`echo_client`] keeps how many of its lines have come back.
pub const ECHOED_FILE: &str = "/tmp/echoed";

/// What [`echo_client`] prints when its connection breaks.
pub const FLOW_BROKEN: &str = "flow broken";

/// A script that opens one TCP connection to an [`echo_server`] at `server:port` and keeps it
/// for its whole life (Cilium's conn-disrupt pattern): a numbered line every 150 ms, each
/// echoed line counted in [`ECHOED_FILE`]. When the connection ends (EOF, reset) or no echo
/// comes back within `stall_secs`, it prints [`FLOW_BROKEN`] and exits 1: it never opens
/// another connection, so a broken flow stays visible in the pod's status.
pub fn echo_client(server: &str, port: u16, stall_secs: u32) -> String {
    format!(
        "echo 0 > {ECHOED_FILE}
        (i=0; while true; do echo $i; i=$((i+1)); sleep 0.15; done) | nc {server} {port} | {{
          n=0
          while read -t {stall_secs} line; do n=$((n+1)); echo $n > {ECHOED_FILE}; done
          echo \"{FLOW_BROKEN} after $n echoes\"
          exit 1
        }}"
    )
}
