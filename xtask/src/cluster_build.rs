//! The cluster tier's Go components, built from source into `target/cluster/bin/`.
//!
//! Go modules committed under `xtask/cluster/` pin them, each with its `go.sum`:
//! `kubernetes/` (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy,
//! kubectl, and the etcd server Kubernetes itself is tested with), `containerd/` (containerd
//! 2.x, its runc shim, ctr), `whereabouts/` (the whereabouts IPAM plugin and its
//! `ip-control-loop`, the cluster IPAM ipq's projection is tested against), `helm/` (Helm 3,
//! which installs ipq's chart in the cluster tier and lints and renders it in the host suite's
//! deploy tests),
//! `flannel/` (flanneld, the three-node cluster's pod network; the Tencent Cloud SDK one of its
//! backends links is not served by the proxy and is stubbed there) and `flannel-cni/` (the
//! `flannel` CNI plugin of containernetworking/plugins v0.9.1, the last release that has it:
//! v1.0.0 moved it to flannel-io/cni-plugin, which the proxy does not serve), `e2e/`
//! (Kubernetes' e2e suite and agnhost) and `coredns/` (the three-node cluster's DNS, CoreDNS
//! with the plugins kubeadm's Corefile answers the cluster with).
//! Separate modules: containerd's dependency graph (its own `k8s.io/cri-api`, gRPC,
//! OpenTelemetry), whereabouts' (client-go 0.31), Helm's (client-go 0.37) and CoreDNS's would
//! otherwise move Kubernetes' under minimal version selection.
//!
//! A binary is rebuilt only when it is missing or does not report the pinned version, so a
//! second run builds nothing. Builds run one at a time (kube-apiserver needs about 4 GB to link)
//! with `-trimpath`, and with the version stamped in by `-ldflags` as Kubernetes' and
//! containerd's own release builds do: without it they report v0.0.0 and the kubelet's version
//! checks misjudge them.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::setup::Outcome;
use crate::util::{self, cmd};

/// Where the binaries go, below the workspace root; `tests/src/cluster` looks there.
pub const BIN_DIR: &str = "target/cluster/bin";
/// Where the CRDs the tier installs for whereabouts go, copied from the pinned modules.
pub const CRD_DIR: &str = "target/cluster/crds";

/// The CRDs whereabouts needs: its own (doc/crds of its module) and the
/// NetworkAttachmentDefinition its control loop watches (the client module's artifacts): the
/// module, the file in it, and the name it is copied to.
const CRDS: &[(&str, &str, &str)] = &[
    (
        "github.com/k8snetworkplumbingwg/whereabouts",
        "doc/crds/whereabouts.cni.cncf.io_ippools.yaml",
        "whereabouts.cni.cncf.io_ippools.yaml",
    ),
    (
        "github.com/k8snetworkplumbingwg/whereabouts",
        "doc/crds/whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
        "whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
    ),
    (
        "github.com/k8snetworkplumbingwg/whereabouts",
        "doc/crds/whereabouts.cni.cncf.io_nodeslicepools.yaml",
        "whereabouts.cni.cncf.io_nodeslicepools.yaml",
    ),
    (
        "github.com/k8snetworkplumbingwg/network-attachment-definition-client",
        "artifacts/networks-crd.yaml",
        "k8s.cni.cncf.io_network-attachment-definitions.yaml",
    ),
];

/// The modules, below the workspace root.
const KUBERNETES_MODULE: &str = "xtask/cluster/kubernetes";
const CONTAINERD_MODULE: &str = "xtask/cluster/containerd";
const WHEREABOUTS_MODULE: &str = "xtask/cluster/whereabouts";
const HELM_MODULE: &str = "xtask/cluster/helm";
const FLANNEL_MODULE: &str = "xtask/cluster/flannel";
const FLANNEL_CNI_MODULE: &str = "xtask/cluster/flannel-cni";
const E2E_MODULE: &str = "xtask/cluster/e2e";
const COREDNS_MODULE: &str = "xtask/cluster/coredns";

/// One binary: its Go package, the module that pins it, and how it reports its version.
struct Component {
    binary: &'static str,
    module: &'static str,
    /// The module path whose pinned version is this binary's version.
    versioned_by: &'static str,
    package: &'static str,
    /// The arguments that make it print its version; empty: it has none (whereabouts'
    /// control loop), and the module versions Go embeds in every binary are read instead.
    version_args: &'static [&'static str],
    /// Built with cgo, as its project releases it (flanneld's udp backend is C).
    cgo: bool,
    /// A package's test binary (`go test -c`): Kubernetes' e2e suite is one.
    test_binary: bool,
}

const COMPONENTS: &[Component] = &[
    kubernetes("kube-apiserver"),
    kubernetes("kube-controller-manager"),
    kubernetes("kube-scheduler"),
    kubernetes("kubelet"),
    // The three-node cluster's Services, in iptables mode: what Kubernetes' Services
    // conformance specs test, with ipq chained.
    kubernetes("kube-proxy"),
    Component {
        version_args: &["version", "--client"],
        ..kubernetes("kubectl")
    },
    Component {
        binary: "etcd",
        module: KUBERNETES_MODULE,
        versioned_by: "go.etcd.io/etcd/server/v3",
        package: "go.etcd.io/etcd/server/v3",
        version_args: &["--version"],
        cgo: false,
        test_binary: false,
    },
    containerd("containerd", &["--version"]),
    containerd("containerd-shim-runc-v2", &["-v"]),
    containerd("ctr", &["--version"]),
    Component {
        binary: "whereabouts",
        module: WHEREABOUTS_MODULE,
        versioned_by: "github.com/k8snetworkplumbingwg/whereabouts",
        // The CNI plugin is the module's `cmd` package itself.
        package: "github.com/k8snetworkplumbingwg/whereabouts/cmd",
        version_args: &[],
        cgo: false,
        test_binary: false,
    },
    Component {
        binary: "ip-control-loop",
        module: WHEREABOUTS_MODULE,
        versioned_by: "github.com/k8snetworkplumbingwg/whereabouts",
        package: "github.com/k8snetworkplumbingwg/whereabouts/cmd/controlloop",
        version_args: &[],
        cgo: false,
        test_binary: false,
    },
    Component {
        binary: "helm",
        module: HELM_MODULE,
        versioned_by: "helm.sh/helm/v3",
        package: "helm.sh/helm/v3/cmd/helm",
        version_args: &["version", "--short"],
        cgo: false,
        test_binary: false,
    },
    // The three-node cluster's pod network, as kube-flannel runs it: flanneld (its main
    // package, with every backend linked in, as its Makefile builds it: cgo on amd64) and the
    // `flannel` CNI plugin, which delegates to bridge + host-local.
    Component {
        binary: "flanneld",
        module: FLANNEL_MODULE,
        versioned_by: "github.com/flannel-io/flannel",
        package: "github.com/flannel-io/flannel",
        version_args: &["--version"],
        cgo: true,
        test_binary: false,
    },
    Component {
        binary: "flannel",
        module: FLANNEL_CNI_MODULE,
        versioned_by: "github.com/containernetworking/plugins",
        package: "github.com/containernetworking/plugins/plugins/meta/flannel",
        version_args: &[],
        cgo: false,
        test_binary: false,
    },
    // Kubernetes' own pod-network conformance tests, run on the three-node cluster with and
    // without ipq: the e2e suite and the agnhost server its tests' pods run.
    Component {
        binary: "e2e.test",
        module: E2E_MODULE,
        versioned_by: "k8s.io/kubernetes",
        package: "k8s.io/kubernetes/test/e2e",
        version_args: &[],
        cgo: false,
        test_binary: true,
    },
    // The three-node cluster's DNS (the Services specs reach a Service by its name): CoreDNS
    // with the plugins of kubeadm's Corefile that answer for the cluster (the module's
    // main.go says which and why).
    Component {
        binary: "coredns",
        module: COREDNS_MODULE,
        versioned_by: "github.com/coredns/coredns",
        package: "github.com/ipq/ipq/xtask/cluster/coredns",
        version_args: &["-version"],
        cgo: false,
        test_binary: false,
    },
    Component {
        binary: "agnhost",
        module: E2E_MODULE,
        versioned_by: "k8s.io/kubernetes",
        package: "k8s.io/kubernetes/test/images/agnhost",
        version_args: &[],
        cgo: false,
        test_binary: false,
    },
];

const fn kubernetes(binary: &'static str) -> Component {
    Component {
        binary,
        module: KUBERNETES_MODULE,
        versioned_by: "k8s.io/kubernetes",
        // Filled in by `package()`: const fns cannot format.
        package: "",
        version_args: &["--version"],
        cgo: false,
        test_binary: false,
    }
}

const fn containerd(binary: &'static str, version_args: &'static [&'static str]) -> Component {
    Component {
        binary,
        module: CONTAINERD_MODULE,
        versioned_by: "github.com/containerd/containerd/v2",
        package: "",
        version_args,
        cgo: false,
        test_binary: false,
    }
}

impl Component {
    fn package(&self) -> String {
        match self.versioned_by {
            _ if !self.package.is_empty() => self.package.to_string(),
            "k8s.io/kubernetes" => format!("k8s.io/kubernetes/cmd/{}", self.binary),
            module => format!("{module}/cmd/{}", self.binary),
        }
    }

    /// `-ldflags` stamping `version` (`v1.35.4`) where this component keeps its version;
    /// `module` is the directory of the Go module that pins it.
    fn ldflags(&self, version: &str, module: &Path) -> Result<String> {
        // -s -w: no symbol table or DWARF; the binaries are tools of the test, not debugged here.
        let mut flags = vec!["-s".to_string(), "-w".to_string()];
        match self.versioned_by {
            "k8s.io/kubernetes" => {
                let (major, minor) = major_minor(version)?;
                // Where Kubernetes' hack/lib/version.sh puts them.
                for package in [
                    "k8s.io/client-go/pkg/version",
                    "k8s.io/component-base/version",
                ] {
                    for (key, value) in [
                        ("gitVersion", version),
                        ("gitMajor", major),
                        ("gitMinor", minor),
                        ("gitTreeState", "clean"),
                    ] {
                        flags.push(format!("-X {package}.{key}={value}"));
                    }
                }
            }
            "github.com/containerd/containerd/v2" => {
                let package = "github.com/containerd/containerd/v2/version";
                flags.push(format!("-X {package}.Version={version}"));
            }
            "github.com/k8snetworkplumbingwg/whereabouts" => {
                // Where its Makefile's hack/build-go.sh puts it (the plugin's `about` string).
                let package = "github.com/k8snetworkplumbingwg/whereabouts/pkg/version";
                flags.push(format!("-X {package}.Version={version}"));
                flags.push(format!("-X {package}.ReleaseStatus=released"));
            }
            "github.com/flannel-io/flannel" => {
                // Where its Makefile puts it (`flanneld --version`).
                flags.push(format!(
                    "-X github.com/flannel-io/flannel/pkg/version.Version={version}"
                ));
            }
            "github.com/containernetworking/plugins" => {
                // Where the plugins' build_linux.sh puts it (the plugin's `about` string).
                flags.push(format!(
                    "-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion={version}"
                ));
            }
            "helm.sh/helm/v3" => {
                // What Helm's Makefile stamps: its version, and the Kubernetes version that
                // `helm template` and `helm lint` assume (`.Capabilities.KubeVersion`), from
                // the client-go it is built with (v0.37 -> 1.37).
                flags.push(format!(
                    "-X helm.sh/helm/v3/internal/version.version={version}"
                ));
                let client_go = pinned_version(module, "k8s.io/client-go")?;
                let (major, minor) = major_minor(&client_go)?;
                let major = major.parse::<u32>().context("client-go's major version")? + 1;
                for package in [
                    "helm.sh/helm/v3/pkg/lint/rules",
                    "helm.sh/helm/v3/pkg/chartutil",
                ] {
                    flags.push(format!("-X {package}.k8sVersionMajor={major}"));
                    flags.push(format!("-X {package}.k8sVersionMinor={minor}"));
                }
            }
            // etcd's and CoreDNS's versions are constants of their source, right as they are.
            _ => {}
        }
        Ok(flags.join(" "))
    }

    /// What `<binary> <version_args>` prints when it is the pinned build.
    fn expected_version(&self, version: &str) -> String {
        match self.versioned_by {
            // `etcd Version: 3.6.5`, `CoreDNS-1.13.1`
            "go.etcd.io/etcd/server/v3" | "github.com/coredns/coredns" => {
                version.trim_start_matches('v').to_string()
            }
            _ => version.to_string(),
        }
    }
}

/// Copies [`CRDS`] from the module cache (`go mod download`, checked against the committed
/// go.sum) into [`CRD_DIR`].
fn copy_crds(go: &Path, root: &Path) -> Result<()> {
    let out_dir = root.join(CRD_DIR);
    fs::create_dir_all(&out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    for (module, file, name) in CRDS {
        let mut download = cmd(go, ["mod", "download", "-json", module]);
        download
            .current_dir(root.join(WHEREABOUTS_MODULE))
            .env("GOFLAGS", "-mod=readonly")
            .env("GOTOOLCHAIN", "local");
        let out = util::probe(&mut download)?;
        let info: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("`go mod download -json {module}` printed no JSON"))?;
        let dir = info["Dir"].as_str().with_context(|| {
            format!(
                "`go mod download -json {module}` gave no directory: {}",
                info["Error"]
            )
        })?;
        let from = Path::new(dir).join(file);
        fs::copy(&from, out_dir.join(name))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    println!("setup: whereabouts' CRDs copied into {CRD_DIR}");
    Ok(())
}

/// `v1.35.4` -> ("1", "35").
fn major_minor(version: &str) -> Result<(&str, &str)> {
    let mut parts = version.trim_start_matches('v').split('.');
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => Ok((major, minor)),
        _ => bail!("`{version}` is not a semantic version"),
    }
}

/// The version `module` pins for `path`, read from its go.mod (`\tpath vX.Y.Z` in a require).
fn pinned_version(module: &Path, path: &str) -> Result<String> {
    let go_mod = module.join("go.mod");
    let text =
        fs::read_to_string(&go_mod).with_context(|| format!("cannot read {}", go_mod.display()))?;
    text.lines()
        .filter(|line| !line.contains("=>"))
        .find_map(|line| {
            let mut words = line.split_whitespace();
            let first = words.next()?;
            let first = if first == "require" {
                words.next()?
            } else {
                first
            };
            (first == path).then(|| words.next().map(str::to_string))?
        })
        .with_context(|| format!("{} requires no version of {path}", go_mod.display()))
}

/// The `go` to build with: on PATH, else where the official tarball installs it.
fn go_binary() -> Result<PathBuf> {
    which::which("go")
        .ok()
        .or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|p| p.is_file()))
        .context(
            "Go is not installed (neither `go` on PATH nor /usr/local/go/bin/go): the cluster \
             tier builds Kubernetes, etcd and containerd from Go modules, which needs Go 1.25 or \
             later (Debian 12's golang-go is too old); install it from go.dev/dl",
        )
}

/// Whether `binary` is there and reports `expected`: by its version flag, or, for one without
/// (`args` empty), by the module versions Go embeds (`go version -m`: `dep <path> <version>`).
fn is_current(component: &Component, binary: &Path, expected: &str) -> bool {
    if component.version_args.is_empty() {
        let Ok(go) = go_binary() else { return false };
        let mut probe = cmd(&go, ["version", "-m"]);
        probe.arg(binary);
        return util::probe(&mut probe).is_ok_and(|out| {
            out.status.success()
                && String::from_utf8_lossy(&out.stdout).lines().any(|line| {
                    let words: Vec<&str> = line.split_whitespace().collect();
                    words.get(1) == Some(&component.versioned_by) && words.get(2) == Some(&expected)
                })
        });
    }
    // flanneld prints its version on stderr.
    util::probe(&mut cmd(binary, component.version_args)).is_ok_and(|out| {
        out.status.success()
            && (String::from_utf8_lossy(&out.stdout).contains(expected)
                || String::from_utf8_lossy(&out.stderr).contains(expected))
    })
}

/// `cargo xtask setup --for cluster`'s step: builds what is missing or stale, one at a time.
pub fn ensure() -> Result<Outcome> {
    let root = util::workspace_root();
    let bin_dir = root.join(BIN_DIR);
    let mut stale = Vec::new();
    for component in COMPONENTS {
        let module = root.join(component.module);
        let version = pinned_version(&module, component.versioned_by)?;
        let binary = bin_dir.join(component.binary);
        let expected = component.expected_version(&version);
        if !is_current(component, &binary, &expected) {
            stale.push((component, module, version, binary, expected));
        }
    }
    let crds_present = CRDS
        .iter()
        .all(|(_, _, name)| root.join(CRD_DIR).join(name).is_file());
    if stale.is_empty() && crds_present {
        return Ok(Outcome::Present);
    }
    let go = go_binary()?;
    if !crds_present {
        copy_crds(&go, &root)?;
    }
    fs::create_dir_all(&bin_dir).with_context(|| format!("cannot create {}", bin_dir.display()))?;
    let all = Instant::now();
    let built = stale.len();
    for (component, module, version, binary, expected) in stale {
        let started = Instant::now();
        let mut build = if component.test_binary {
            cmd(&go, ["test", "-c", "-trimpath"])
        } else {
            cmd(&go, ["build", "-trimpath"])
        };
        build
            .args(["-tags", "no_btrfs", "-ldflags"])
            .arg(component.ldflags(&version, &module)?)
            .arg("-o")
            .arg(&binary)
            .arg(component.package())
            .current_dir(&module)
            // Static binaries, as the projects release them, but for flanneld (cgo, linked
            // against the machine's libc, which its image carries).
            .env("CGO_ENABLED", if component.cgo { "1" } else { "0" })
            // go.sum is committed: a build never edits it, and never fetches a Go toolchain.
            .env("GOFLAGS", "-mod=readonly -buildvcs=false")
            .env("GOTOOLCHAIN", "local");
        util::run(&mut build).with_context(|| {
            format!(
                "building {} {version} failed (see Go's output above; {}); the modules come \
                 from the Go module proxy",
                component.binary,
                util::free_space_of(&root.join("target"))
            )
        })?;
        if !is_current(component, &binary, &expected) {
            bail!(
                "built {} but `{}` does not report {expected}",
                binary.display(),
                if component.version_args.is_empty() {
                    format!("go version -m {}", component.binary)
                } else {
                    format!("{} {}", component.binary, component.version_args.join(" "))
                }
            );
        }
        println!(
            "setup: built {} {version} in {:.0?}",
            component.binary,
            started.elapsed()
        );
    }
    if built > 0 {
        println!("setup: cluster components built in {:.0?}", all.elapsed());
    }
    Ok(Outcome::Installed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_modules_pin_every_component() {
        let root = util::workspace_root();
        for component in COMPONENTS {
            let module = root.join(component.module);
            let version = pinned_version(&module, component.versioned_by).unwrap();
            assert!(version.starts_with('v'), "{}: {version}", component.binary);
            component.ldflags(&version, &module).unwrap();
        }
    }

    #[test]
    fn kubernetes_ldflags_stamp_the_version() {
        let module = util::workspace_root().join(KUBERNETES_MODULE);
        let flags = kubernetes("kubelet").ldflags("v1.35.4", &module).unwrap();
        assert!(flags.contains("-X k8s.io/component-base/version.gitVersion=v1.35.4"));
        assert!(flags.contains("-X k8s.io/component-base/version.gitMinor=35"));
        assert_eq!(
            kubernetes("kubelet").package(),
            "k8s.io/kubernetes/cmd/kubelet"
        );
    }

    #[test]
    fn helm_ldflags_stamp_its_version_and_the_kubernetes_it_assumes() {
        let helm = COMPONENTS.iter().find(|c| c.binary == "helm").unwrap();
        let module = util::workspace_root().join(HELM_MODULE);
        let flags = helm.ldflags("v3.22.0", &module).unwrap();
        assert!(flags.contains("-X helm.sh/helm/v3/internal/version.version=v3.22.0"));
        // client-go v0.37.x is Kubernetes 1.37.
        assert!(flags.contains("-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1"));
        assert!(flags.contains("-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37"));
        assert_eq!(helm.package(), "helm.sh/helm/v3/cmd/helm");
    }
}
