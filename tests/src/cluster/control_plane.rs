//! The control plane on the node's loopback: etcd, kube-apiserver, kube-controller-manager and
//! kube-scheduler, each started with the cluster's own certificates and waited for.

use std::{net::IpAddr, path::Path, time::Duration};

use anyhow::Context as _;

use super::{
    daemon::{component, Daemon},
    host::{Host, NODE_IP},
    pki::{write_kubeconfig, Pki},
};

pub const APISERVER_URL: &str = "https://127.0.0.1:6443";
const ETCD_URL: &str = "http://127.0.0.1:2379";
const SERVICE_RANGE: &str = "10.96.0.0/16";

/// The running control plane; dropping it stops it.
pub struct ControlPlane {
    /// In start order; dropped (killed) in reverse.
    daemons: Vec<Daemon>,
    pub admin_kubeconfig: std::path::PathBuf,
    /// kube-apiserver's program and arguments, to start it again after an outage.
    apiserver_command: (std::path::PathBuf, Vec<std::ffi::OsString>),
}

/// Where kube-apiserver is in `daemons`.
const APISERVER: usize = 1;

/// What differs for a cluster of several nodes: the API server is reached from the other
/// nodes (on the nodes' L2, at [`NODE_IP`]), and the controller manager gives each Node a pod
/// range of `cluster_cidr` (flannel's `--kube-subnet-mgr` reads it).
#[derive(Clone, Copy, Debug)]
pub struct ManyNodes<'a> {
    pub cluster_cidr: &'a str,
}

impl ControlPlane {
    pub fn start(host: &Host, pki: &Pki) -> anyhow::Result<ControlPlane> {
        ControlPlane::start_for(host, pki, None)
    }

    /// [`ControlPlane::start`], for several nodes when `many` says so.
    pub fn start_for(
        host: &Host,
        pki: &Pki,
        many: Option<ManyNodes<'_>>,
    ) -> anyhow::Result<ControlPlane> {
        let dir = host.dir();
        let kubeconfig = |name: &str, user| -> anyhow::Result<std::path::PathBuf> {
            let path = dir.join(format!("{name}.kubeconfig"));
            write_kubeconfig(&path, APISERVER_URL, &pki.ca.cert, user)?;
            Ok(path)
        };
        let admin_kubeconfig = kubeconfig("admin", &pki.admin)?;
        let mut plane = ControlPlane {
            daemons: Vec::new(),
            admin_kubeconfig,
            apiserver_command: (component("kube-apiserver")?, Vec::new()),
        };

        let etcd_dir = dir.join("etcd");
        let mut etcd = host.command(component("etcd")?);
        etcd.arg("--name=node")
            .arg(format!("--data-dir={}", etcd_dir.display()))
            .arg(format!("--listen-client-urls={ETCD_URL}"))
            .arg(format!("--advertise-client-urls={ETCD_URL}"))
            .arg("--listen-peer-urls=http://127.0.0.1:2380")
            .arg("--initial-advertise-peer-urls=http://127.0.0.1:2380")
            .arg("--initial-cluster=node=http://127.0.0.1:2380")
            // A test's cluster lives for minutes: durability buys nothing, fsyncs cost seconds.
            .arg("--unsafe-no-fsync");
        plane.daemons.push(Daemon::spawn("etcd", etcd, dir)?);

        let mut apiserver = host.command(component("kube-apiserver")?);
        let file = |p: &Path| p.display().to_string();
        apiserver
            .arg(format!("--etcd-servers={ETCD_URL}"))
            // The other nodes dial it on the nodes' L2.
            .arg(if many.is_some() {
                "--bind-address=0.0.0.0"
            } else {
                "--bind-address=127.0.0.1"
            })
            .arg("--secure-port=6443")
            // The address the `kubernetes` Service names; nothing in the tier dials it.
            .arg(format!("--advertise-address={NODE_IP}"))
            .arg(format!("--client-ca-file={}", file(&pki.ca.cert)))
            .arg(format!("--tls-cert-file={}", file(&pki.apiserver.cert)))
            .arg(format!(
                "--tls-private-key-file={}",
                file(&pki.apiserver.key)
            ))
            .arg(format!(
                "--kubelet-client-certificate={}",
                file(&pki.apiserver_kubelet_client.cert)
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                file(&pki.apiserver_kubelet_client.key)
            ))
            // The node's name resolves nowhere: exec and logs dial its InternalIP (as kubeadm's
            // clusters do).
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-key-file={}",
                file(&pki.service_account_pub)
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                file(&pki.service_account_key)
            ))
            .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
            .arg("--authorization-mode=Node,RBAC")
            // The DaemonSet's init step mounts bpffs from a privileged container.
            .arg("--allow-privileged=true")
            .arg("--profiling=false");
        // `host.command` runs nsenter: the component's own arguments follow its path.
        plane.apiserver_command.1 = apiserver
            .get_args()
            .skip_while(|arg| *arg != plane.apiserver_command.0.as_os_str())
            .skip(1)
            .map(ToOwned::to_owned)
            .collect();
        plane
            .daemons
            .push(Daemon::spawn("kube-apiserver", apiserver, dir)?);
        plane.wait_ready(host)?;

        let mut controller_manager = host.command(component("kube-controller-manager")?);
        controller_manager
            .arg(format!(
                "--kubeconfig={}",
                file(&kubeconfig("controller-manager", &pki.controller_manager)?)
            ))
            .arg("--bind-address=127.0.0.1")
            .arg("--leader-elect=false")
            .arg(format!(
                "--service-account-private-key-file={}",
                file(&pki.service_account_key)
            ))
            .arg(format!("--root-ca-file={}", file(&pki.ca.cert)))
            // Each controller as its own service account, with the roles the API server's RBAC
            // bootstrap gives them (as kubeadm runs it): the manager's own user may not, e.g.,
            // patch nodes or create a DaemonSet's pods.
            .arg("--use-service-account-credentials=true")
            .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"));
        if let Some(many) = many {
            // What kubeadm's `--pod-network-cidr` sets, and what flannel's manifests ask for.
            controller_manager
                .arg("--allocate-node-cidrs=true")
                .arg(format!("--cluster-cidr={}", many.cluster_cidr))
                .arg("--node-cidr-mask-size=24");
        }
        plane.daemons.push(Daemon::spawn(
            "kube-controller-manager",
            controller_manager,
            dir,
        )?);

        let mut scheduler = host.command(component("kube-scheduler")?);
        scheduler
            .arg(format!(
                "--kubeconfig={}",
                file(&kubeconfig("scheduler", &pki.scheduler)?)
            ))
            .arg("--bind-address=127.0.0.1")
            .arg("--leader-elect=false");
        plane
            .daemons
            .push(Daemon::spawn("kube-scheduler", scheduler, dir)?);
        Ok(plane)
    }

    /// Waits until the API server answers `/readyz` (etcd reached, its post-start hooks done);
    /// when the probe that saw it ready began (the API server was not ready at the start of
    /// the probe before, one poll interval and a kubectl run earlier).
    fn wait_ready(&mut self, host: &Host) -> anyhow::Result<std::time::SystemTime> {
        let kubectl = component("kubectl")?;
        let kubeconfig = self.admin_kubeconfig.clone();
        let result = crate::lab::poll("the API server's /readyz", Duration::from_secs(120), || {
            // etcd and the API server: the components started after it (the controller
            // manager exits when the API server goes away while it initializes) are not what
            // this waits for.
            for daemon in self.daemons.iter_mut().take(APISERVER + 1) {
                daemon.check_running()?;
            }
            let began = std::time::SystemTime::now();
            let out = host
                .command(&kubectl)
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .args(["get", "--raw", "/readyz"])
                .output()?;
            Ok((out.status.success() && out.stdout.starts_with(b"ok")).then_some(began))
        });
        result.with_context(|| {
            format!(
                "kube-apiserver's log ends:\n{}\netcd's log ends:\n{}",
                self.daemons[1].log_tail(20),
                self.daemons[0].log_tail(10)
            )
        })
    }

    /// Stops kube-apiserver (killed: its port refuses connections) until
    /// [`ControlPlane::start_apiserver`].
    pub fn stop_apiserver(&mut self) {
        self.daemons[APISERVER].stop();
    }

    /// Starts kube-apiserver again with its arguments of the first start; returns once it
    /// answers `/readyz`, with when the probe that saw it ready began.
    pub fn start_apiserver(&mut self, host: &Host) -> anyhow::Result<std::time::SystemTime> {
        let (program, args) = &self.apiserver_command;
        let mut cmd = host.command(program);
        cmd.args(args);
        self.daemons[APISERVER].restart(cmd)?;
        self.wait_ready(host)
    }

    /// Fails naming the first component that has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        for daemon in &mut self.daemons {
            daemon.check_running()?;
        }
        Ok(())
    }

    /// The tail of each component's log, for an error message.
    pub fn logs(&self) -> String {
        self.daemons
            .iter()
            .skip(1)
            .map(|d| format!("{}'s log ends:\n{}\n", d.name, d.log_tail(15)))
            .collect()
    }

    /// The addresses the API server's certificate must name.
    pub fn serving_ips() -> Vec<IpAddr> {
        ["127.0.0.1", NODE_IP, "10.96.0.1"]
            .iter()
            .map(|ip| ip.parse().expect("literal addresses"))
            .collect()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        while let Some(daemon) = self.daemons.pop() {
            drop(daemon);
        }
    }
}
