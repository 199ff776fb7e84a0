//! A kubelet-shaped CRI client: what the kubelet asks containerd over the CRI v1 socket to run
//! a pod (`RunPodSandbox` with the pod's metadata, `CreateContainer` + `StartContainer`), read
//! its address (`PodSandboxStatus`), exec in it, and end it the way the kubelet does
//! (`StopContainer` with the grace period, `StopPodSandbox`, `RemovePodSandbox`).

use std::{collections::HashMap, net::IpAddr, path::Path, time::Duration};

use anyhow::Context as _;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    image_service_client::ImageServiceClient, runtime_service_client::RuntimeServiceClient,
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ExecSyncRequest, ImageSpec,
    LinuxContainerConfig, LinuxPodSandboxConfig, ListImagesRequest, ListPodSandboxRequest,
    PodSandboxConfig, PodSandboxMetadata, PodSandboxState, PodSandboxStatusRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StatusRequest,
    StopContainerRequest, StopPodSandboxRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// A pod as the kubelet describes it to the runtime.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// cgroupfs parent of the pod's containers (the test's own, removed after it).
    pub cgroup_parent: String,
}

/// A connection to one containerd's CRI.
pub struct Cri {
    runtime: tokio::runtime::Runtime,
    service: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

/// How long one CRI call may take (a sandbox's CNI ADD included).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl Cri {
    /// Connects to the CRI socket at `socket`.
    pub fn connect(socket: &Path) -> anyhow::Result<Cri> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let path = socket.to_owned();
        let channel = runtime
            .block_on(
                // The URI is a placeholder: every connection goes to the unix socket.
                Endpoint::try_from("http://[::]:50051")?
                    .timeout(CALL_TIMEOUT)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    })),
            )
            .with_context(|| format!("connecting to the CRI at {}", socket.display()))?;
        Ok(Cri {
            runtime,
            service: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        })
    }

    /// The image references containerd's CRI lists.
    pub fn images(&self) -> anyhow::Result<Vec<String>> {
        let mut client = self.images.clone();
        let list = self
            .runtime
            .block_on(client.list_images(ListImagesRequest { filter: None }))?
            .into_inner();
        Ok(list.images.into_iter().flat_map(|i| i.repo_tags).collect())
    }

    /// The CNI config the CRI plugin has loaded (`Status` verbose, its `cniconfig` info), as
    /// JSON text: what the next sandbox's ADD will run.
    pub fn cni_config(&self) -> anyhow::Result<String> {
        let mut client = self.service.clone();
        let status = self
            .runtime
            .block_on(client.status(StatusRequest { verbose: true }))
            .map_err(|s| status_error("Status", "the runtime", s))?
            .into_inner();
        Ok(status.info.get("cniconfig").cloned().unwrap_or_default())
    }

    fn sandbox_config(pod: &PodSpec, log_dir: &Path) -> PodSandboxConfig {
        PodSandboxConfig {
            metadata: Some(PodSandboxMetadata {
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                namespace: pod.namespace.clone(),
                attempt: 0,
            }),
            hostname: pod.name.clone(),
            log_directory: log_dir.to_string_lossy().into_owned(),
            linux: Some(LinuxPodSandboxConfig {
                cgroup_parent: pod.cgroup_parent.clone(),
                ..Default::default()
            }),
            labels: HashMap::from([("io.kubernetes.pod.name".into(), pod.name.clone())]),
            ..Default::default()
        }
    }

    /// `RunPodSandbox`: the pause container and the CNI ADD; the sandbox id.
    pub fn run_pod_sandbox(&self, pod: &PodSpec, log_dir: &Path) -> anyhow::Result<String> {
        let mut client = self.service.clone();
        let request = RunPodSandboxRequest {
            config: Some(Self::sandbox_config(pod, log_dir)),
            runtime_handler: String::new(),
        };
        let answer = self
            .runtime
            .block_on(client.run_pod_sandbox(request))
            .map_err(|s| status_error("RunPodSandbox", &pod.name, s))?;
        Ok(answer.into_inner().pod_sandbox_id)
    }

    /// `CreateContainer` + `StartContainer` of `image` running `command` in the sandbox.
    pub fn start_container(
        &self,
        sandbox_id: &str,
        pod: &PodSpec,
        log_dir: &Path,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> anyhow::Result<String> {
        let mut client = self.service.clone();
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            log_path: format!("{name}.log"),
            linux: Some(LinuxContainerConfig::default()),
            ..Default::default()
        };
        let request = CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(Self::sandbox_config(pod, log_dir)),
        };
        let id = self
            .runtime
            .block_on(client.create_container(request))
            .map_err(|s| status_error("CreateContainer", name, s))?
            .into_inner()
            .container_id;
        self.runtime
            .block_on(client.start_container(StartContainerRequest {
                container_id: id.clone(),
            }))
            .map_err(|s| status_error("StartContainer", name, s))?;
        Ok(id)
    }

    /// `StopContainer` with the grace period the kubelet gives (SIGTERM, then SIGKILL).
    pub fn stop_container(&self, container_id: &str, grace: Duration) -> anyhow::Result<()> {
        let mut client = self.service.clone();
        self.runtime
            .block_on(client.stop_container(StopContainerRequest {
                container_id: container_id.to_owned(),
                timeout: i64::try_from(grace.as_secs()).unwrap_or(i64::MAX),
            }))
            .map_err(|s| status_error("StopContainer", container_id, s))?;
        Ok(())
    }

    /// `StopPodSandbox`: containers killed, the pause container, then the CNI DEL.
    pub fn stop_pod_sandbox(&self, sandbox_id: &str) -> anyhow::Result<()> {
        let mut client = self.service.clone();
        self.runtime
            .block_on(client.stop_pod_sandbox(StopPodSandboxRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
            }))
            .map_err(|s| status_error("StopPodSandbox", sandbox_id, s))?;
        Ok(())
    }

    /// `RemovePodSandbox`.
    pub fn remove_pod_sandbox(&self, sandbox_id: &str) -> anyhow::Result<()> {
        let mut client = self.service.clone();
        self.runtime
            .block_on(client.remove_pod_sandbox(RemovePodSandboxRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
            }))
            .map_err(|s| status_error("RemovePodSandbox", sandbox_id, s))?;
        Ok(())
    }

    /// `ListPodSandbox`: the ids of the sandboxes that are ready (running), as the kubelet's
    /// relist sees them.
    pub fn ready_sandboxes(&self) -> anyhow::Result<Vec<String>> {
        let mut client = self.service.clone();
        let list = self
            .runtime
            .block_on(client.list_pod_sandbox(ListPodSandboxRequest { filter: None }))
            .map_err(|s| status_error("ListPodSandbox", "all", s))?
            .into_inner();
        Ok(list
            .items
            .into_iter()
            .filter(|s| s.state == PodSandboxState::SandboxReady as i32)
            .map(|s| s.id)
            .collect())
    }

    /// The sandbox's IP as `PodSandboxStatus` reports it (what the kubelet puts in the pod's
    /// status).
    pub fn pod_ip(&self, sandbox_id: &str) -> anyhow::Result<IpAddr> {
        let mut client = self.service.clone();
        let status = self
            .runtime
            .block_on(client.pod_sandbox_status(PodSandboxStatusRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
                verbose: false,
            }))
            .map_err(|s| status_error("PodSandboxStatus", sandbox_id, s))?
            .into_inner();
        let ip = status
            .status
            .and_then(|s| s.network)
            .map(|n| n.ip)
            .unwrap_or_default();
        ip.parse()
            .with_context(|| format!("sandbox {sandbox_id} has no IP in its status: {ip:?}"))
    }

    /// `ExecSync`: `command` in the container; its exit code and output.
    pub fn exec_sync(
        &self,
        container_id: &str,
        command: &[&str],
        timeout: Duration,
    ) -> anyhow::Result<(i32, String)> {
        let mut client = self.service.clone();
        let answer = self
            .runtime
            .block_on(client.exec_sync(ExecSyncRequest {
                container_id: container_id.to_owned(),
                cmd: command.iter().map(|s| (*s).to_owned()).collect(),
                timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            }))
            .map_err(|s| status_error("ExecSync", container_id, s))?
            .into_inner();
        let mut out = String::from_utf8_lossy(&answer.stdout).into_owned();
        out.push_str(&String::from_utf8_lossy(&answer.stderr));
        Ok((answer.exit_code, out))
    }
}

/// The kubelet's `StopContainer` with `grace`, on a thread and a connection of its own (it
/// blocks for up to the grace period); joined, how long it took.
pub fn stop_container_in_background(
    socket: &Path,
    container_id: &str,
    grace: Duration,
) -> std::thread::JoinHandle<anyhow::Result<Duration>> {
    let socket = socket.to_owned();
    let container_id = container_id.to_owned();
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        Cri::connect(&socket)?.stop_container(&container_id, grace)?;
        Ok(started.elapsed())
    })
}

fn status_error(call: &str, what: &str, status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(
        "CRI {call} of {what}: {} ({:?})",
        status.message(),
        status.code()
    )
}
