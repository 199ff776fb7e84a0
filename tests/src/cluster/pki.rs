//! The cluster's own certificates, made fresh for each cluster: one CA, the API server's
//! serving certificate, a client certificate per component (the test's admin, the controller
//! manager, the scheduler, the kubelets, kube-proxy, the API server towards the kubelet), and the
//! key pair that signs service-account tokens. Nothing is shared with the machine or another run.

use std::{fs, net::IpAddr, path::Path};

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

/// A certificate and its key, as PEM files on disk.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

/// Every file the control plane and the kubelet are started with.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca: CertFiles,
    pub apiserver: CertFiles,
    pub apiserver_kubelet_client: CertFiles,
    pub admin: CertFiles,
    pub controller_manager: CertFiles,
    pub scheduler: CertFiles,
    /// Each node's kubelet (`system:node:<name>`), in the order of the names given.
    pub kubelets: Vec<CertFiles>,
    /// Every node's kube-proxy: `system:kube-proxy`, whom the API server's default
    /// ClusterRoleBinding `system:node-proxier` grants what kube-proxy reads.
    pub kube_proxy: CertFiles,
    /// The service-account signing key (PKCS#8) and its public half.
    pub service_account_key: std::path::PathBuf,
    pub service_account_pub: std::path::PathBuf,
}

/// Who a client certificate names: Kubernetes reads the user from the CN and the groups from O.
struct Subject<'a> {
    user: &'a str,
    groups: &'a [&'a str],
}

impl Pki {
    /// Writes a fresh PKI under `dir`; `nodes` are the nodes' names (a kubelet certificate
    /// each), `serving_ips` the addresses the API server is reached at.
    pub fn create(dir: &Path, nodes: &[&str], serving_ips: &[IpAddr]) -> anyhow::Result<Pki> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "ipq cluster tier CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;
        let ca_files = write(dir, "ca", &ca.pem(), &ca.key().serialize_pem())?;

        let leaf = |name: &str,
                    subject: Subject<'_>,
                    usage: ExtendedKeyUsagePurpose,
                    dns: &[&str],
                    ips: &[IpAddr]|
         -> anyhow::Result<CertFiles> {
            let key = KeyPair::generate()?;
            let names: Vec<String> = dns.iter().map(|d| d.to_string()).collect();
            let mut params = CertificateParams::new(names)?;
            params
                .subject_alt_names
                .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
            params
                .distinguished_name
                .push(DnType::CommonName, subject.user);
            for group in subject.groups {
                params
                    .distinguished_name
                    .push(DnType::OrganizationName, *group);
            }
            params.key_usages = vec![
                KeyUsagePurpose::DigitalSignature,
                KeyUsagePurpose::KeyEncipherment,
            ];
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca)?;
            write(dir, name, &cert.pem(), &key.serialize_pem())
        };
        let client = |name: &str, user: &str, groups: &[&str]| {
            leaf(
                name,
                Subject { user, groups },
                ExtendedKeyUsagePurpose::ClientAuth,
                &[],
                &[],
            )
        };

        let apiserver = leaf(
            "apiserver",
            Subject {
                user: "kube-apiserver",
                groups: &[],
            },
            ExtendedKeyUsagePurpose::ServerAuth,
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            serving_ips,
        )?;
        let service_account = KeyPair::generate()?;
        let service_account_key = dir.join("sa.key");
        let service_account_pub = dir.join("sa.pub");
        fs::write(&service_account_key, service_account.serialize_pem())?;
        fs::write(&service_account_pub, service_account.public_key_pem())?;
        Ok(Pki {
            ca: ca_files,
            apiserver,
            apiserver_kubelet_client: client(
                "apiserver-kubelet-client",
                "kube-apiserver-kubelet-client",
                &["system:masters"],
            )?,
            admin: client("admin", "ipq-cluster-tier", &["system:masters"])?,
            controller_manager: client(
                "controller-manager",
                "system:kube-controller-manager",
                &[],
            )?,
            scheduler: client("scheduler", "system:kube-scheduler", &[])?,
            kubelets: nodes
                .iter()
                .map(|node| {
                    client(
                        &format!("kubelet-{node}"),
                        &format!("system:node:{node}"),
                        &["system:nodes"],
                    )
                })
                .collect::<anyhow::Result<_>>()?,
            kube_proxy: client("kube-proxy", "system:kube-proxy", &[])?,
            service_account_key,
            service_account_pub,
        })
    }
}

fn write(dir: &Path, name: &str, cert_pem: &str, key_pem: &str) -> anyhow::Result<CertFiles> {
    let files = CertFiles {
        cert: dir.join(format!("{name}.crt")),
        key: dir.join(format!("{name}.key")),
    };
    fs::write(&files.cert, cert_pem)
        .with_context(|| format!("writing {}", files.cert.display()))?;
    fs::write(&files.key, key_pem).with_context(|| format!("writing {}", files.key.display()))?;
    Ok(files)
}

/// A kubeconfig for `user` at `server`, written to `path`.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &CertFiles,
) -> anyhow::Result<()> {
    let text = format!(
        "apiVersion: v1
kind: Config
clusters:
- name: ipq
  cluster:
    server: {server}
    certificate-authority: {ca}
users:
- name: user
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: ipq
  context:
    cluster: ipq
    user: user
current-context: ipq
",
        ca = ca.display(),
        cert = user.cert.display(),
        key = user.key.display(),
    );
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
