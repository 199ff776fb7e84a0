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
