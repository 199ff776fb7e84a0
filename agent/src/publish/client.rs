//! The agent's Kubernetes clients, rebuilt when their credentials change: a client is made
//! from the kubeconfig (and the files it names) or the pod's service account files, and kept
//! only while those files are unchanged (compared by size and modification time at each use:
//! a few `stat`s, at most a few times a second) and while calls made with it do not fail to
//! connect or authenticate. A rotated CA, client certificate or token then needs no restart.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use kube::{config::Kubeconfig, Client};

use super::{kube_sink::client_for, FailureReason, WriteError};

/// The service account files of a pod (kube's in-cluster configuration reads these).
const SERVICE_ACCOUNT_FILES: [&str; 2] = [
    "/var/run/secrets/kubernetes.io/serviceaccount/token",
    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
];

/// What the credentials' files were when the client was made.
type Fingerprint = Vec<(PathBuf, Option<(SystemTime, u64)>)>;

/// A client kept while its credentials hold.
pub struct CachedClient {
    kubeconfig: Option<PathBuf>,
    read_timeout: Duration,
    cached: Option<(Client, Fingerprint)>,
    builds: u64,
}

impl CachedClient {
    pub fn new(kubeconfig: Option<PathBuf>, read_timeout: Duration) -> Self {
        Self {
            kubeconfig,
            read_timeout,
            cached: None,
            builds: 0,
        }
    }

    /// The client, made again if a credentials file changed since it was made.
    pub async fn get(&mut self) -> Result<Client, WriteError> {
        let now = fingerprint(self.kubeconfig.as_deref());
        if let Some((client, made_with)) = &self.cached {
            if *made_with == now {
                return Ok(client.clone());
            }
        }
        let client = client_for(self.kubeconfig.as_deref(), self.read_timeout).await?;
        self.builds += 1;
        self.cached = Some((client.clone(), now));
        Ok(client)
    }

    /// Drops the client after `error` if it may be its credentials' fault (no connection or
    /// TLS handshake, credentials refused): the next call makes one from the files again.
    pub fn after_failure(&mut self, error: &WriteError) {
        if matches!(
            error.reason,
            FailureReason::Unreachable | FailureReason::Config
        ) {
            self.cached = None;
        }
    }

    /// Whether the next [`Self::get`] makes a new client: none is kept, or a credentials file
    /// changed since it was made. A long-lived user of a client (a watch) starts again then.
    pub fn files_changed(&self) -> bool {
        self.cached
            .as_ref()
            .is_none_or(|(_, made_with)| *made_with != fingerprint(self.kubeconfig.as_deref()))
    }

    /// How many clients were made.
    #[cfg(test)]
    pub fn builds(&self) -> u64 {
        self.builds
    }
}

/// The files the client's credentials come from, with their size and modification time.
fn fingerprint(kubeconfig: Option<&Path>) -> Fingerprint {
    let files: Vec<PathBuf> = match kubeconfig {
        Some(path) => {
            let mut files = vec![path.to_owned()];
            files.extend(named_files(path));
            files
        }
        None => SERVICE_ACCOUNT_FILES.iter().map(PathBuf::from).collect(),
    };
    files
        .into_iter()
        .map(|file| {
            let stamp = std::fs::metadata(&file)
                .ok()
                .and_then(|m| Some((m.modified().ok()?, m.len())));
            (file, stamp)
        })
        .collect()
}

/// The CA, client certificate, key and token files a kubeconfig names (relative to its
/// directory, as kubectl resolves them).
fn named_files(kubeconfig: &Path) -> Vec<PathBuf> {
    let Ok(config) = Kubeconfig::read_from(kubeconfig) else {
        return Vec::new();
    };
    let base = kubeconfig.parent().unwrap_or(Path::new("."));
    let clusters = config
        .clusters
        .iter()
        .filter_map(|c| c.cluster.as_ref()?.certificate_authority.clone());
    let users = config.auth_infos.iter().flat_map(|a| {
        a.auth_info
            .as_ref()
            .map(|info| {
                [
                    info.client_certificate.clone(),
                    info.client_key.clone(),
                    info.token_file.clone(),
                ]
            })
            .into_iter()
            .flatten()
            .flatten()
    });
    clusters.chain(users).map(|file| base.join(file)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(dir: &Path, ca: &str, token: &str) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: \
                 https://127.0.0.1:1\n    certificate-authority: {ca}\nusers:\n- name: u\n  \
                 user:\n    token: {token}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    \
                 user: u\ncurrent-context: x\n"
            ),
        )
        .unwrap();
        path
    }

    /// A self-signed CA in PEM (any valid certificate: nothing connects).
    fn write_ca(path: &Path, serial: u8) {
        std::fs::write(path, test_ca(serial)).unwrap();
    }

    fn test_ca(serial: u8) -> String {
        // Two different valid certificates are not needed: the client is rebuilt on the file's
        // change, whatever it holds; the same PEM with a comment line differs in size.
        format!("{TEST_CA_PEM}\n# rotation {serial}\n")
    }

    const TEST_CA_PEM: &str = include_str!("client_test_ca.pem");

    #[tokio::test]
    async fn a_rotated_ca_or_token_makes_a_new_client_and_nothing_else_does() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.crt");
        write_ca(&ca, 1);
        let config = kubeconfig(dir.path(), "ca.crt", "token-1");
        let mut clients = CachedClient::new(Some(config.clone()), Duration::from_secs(1));
        clients.get().await.expect("a client");
        clients.get().await.expect("a client");
        assert_eq!(clients.builds(), 1, "unchanged files: one client");

        // The CA the kubeconfig names is rotated (a relative path, as kubectl resolves it).
        write_ca(&ca, 22);
        assert!(
            clients.files_changed(),
            "a long-lived watch sees the rotation"
        );
        clients.get().await.expect("a client");
        assert!(!clients.files_changed());
        assert_eq!(clients.builds(), 2, "a rotated CA: a new client");

        // The kubeconfig's token is rotated.
        kubeconfig(dir.path(), "ca.crt", "token-rotated");
        clients.get().await.expect("a client");
        assert_eq!(clients.builds(), 3, "a rotated token: a new client");

        // A refused or failed connection drops it; a refused request (forbidden) does not.
        let refused = WriteError {
            reason: FailureReason::Refused,
            message: "forbidden".into(),
        };
        clients.after_failure(&refused);
        clients.get().await.expect("a client");
        assert_eq!(clients.builds(), 3);
        let unreachable = WriteError {
            reason: FailureReason::Unreachable,
            message: "tls handshake".into(),
        };
        clients.after_failure(&unreachable);
        clients.get().await.expect("a client");
        assert_eq!(clients.builds(), 4, "after a TLS failure: a new client");
    }
}
