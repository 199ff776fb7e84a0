//! The temp dir a [`super::Podman`] keeps everything in: storage, podman's config (through
//! `CONTAINERS_CONF`, `CONTAINERS_STORAGE_CONF`, `CONTAINERS_REGISTRIES_CONF`), the CNI config
//! and plugin dirs, host-local's `dataDir` and the containers' rootfs dirs.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _};

use super::{BridgeNetwork, APPLETS, BUSYBOX, CNI_PLUGINS};

/// Creates the private directories under `d`, links `/usr/lib/cni/*` and `extra_plugins`
/// (type name → binary) into its plugin dir, and writes podman's config and `network`'s
/// conflist there.
pub(super) fn write(
    d: &Path,
    network: &BridgeNetwork,
    extra_plugins: &[(&str, &Path)],
) -> anyhow::Result<()> {
    for sub in [
        "root", "runroot", "tmp", "net.d", "cni-bin", "ipam", "rootfs",
    ] {
        fs::create_dir(d.join(sub))?;
    }
    let bin = d.join("cni-bin");
    for plugin in fs::read_dir(CNI_PLUGINS).with_context(|| format!("listing {CNI_PLUGINS}"))? {
        let plugin = plugin?;
        symlink(plugin.path(), bin.join(plugin.file_name()))?;
    }
    for (name, path) in extra_plugins {
        if !path.is_file() {
            bail!("CNI plugin {name}: {} is not a file", path.display());
        }
        symlink(path, bin.join(name))?;
    }
    let path = |sub: &str| d.join(sub).display().to_string();
    fs::write(
        d.join("containers.conf"),
        format!(
            r#"[containers]
log_driver = "k8s-file"
netns = "private"

[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{netd}"
default_network = "{name}"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "none"
lock_type = "file"
runtime = "runc"
tmp_dir = "{tmp}"
static_dir = "{static_dir}"
volume_path = "{volumes}"
"#,
            bin = path("cni-bin"),
            netd = path("net.d"),
            name = network.name,
            tmp = path("tmp"),
            static_dir = path("root/libpod"),
            volumes = path("root/volumes"),
        ),
    )?;
    fs::write(
        d.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            path("root"),
            path("runroot")
        ),
    )?;
    // No registries: nothing is ever pulled.
    fs::write(
        d.join("registries.conf"),
        "unqualified-search-registries = []\n",
    )?;
    let net = network;
    let host_local = format!(
        r#"{{"type":"host-local","dataDir":"{ipam}","ranges":[[{{"subnet":"{subnet}","gateway":"{gateway}"}}]],"routes":[{{"dst":"0.0.0.0/0"}}]}}"#,
        ipam = path("ipam"),
        subnet = net.subnet,
        gateway = net.gateway,
    );
    let ipam = match &net.ipam_wrapper {
        None => host_local,
        Some(wrapper) => {
            let mut wrapper = wrapper.clone();
            wrapper["delegate"] = serde_json::from_str(&host_local)?;
            wrapper.to_string()
        }
    };
    let mut plugins = vec![format!(
        r#"{{"type":"bridge","bridge":"{bridge}","isGateway":true,"ipMasq":false,"hairpinMode":false,"capabilities":{{"ips":true}},"ipam":{ipam}}}"#,
        bridge = net.bridge,
    )];
    plugins.extend(net.chained.iter().cloned());
    fs::write(
        d.join("net.d").join(format!("{}.conflist", net.name)),
        format!(
            r#"{{"cniVersion":"1.0.0","name":"{}","plugins":[{}]}}"#,
            net.name,
            plugins.join(",")
        ),
    )?;
    Ok(())
}

/// A rootfs of its own under `d` for container `name`: the static busybox and its applet
/// links.
pub(super) fn rootfs(d: &Path, name: &str) -> anyhow::Result<PathBuf> {
    let root = d.join("rootfs").join(name);
    let bin = root.join("bin");
    fs::create_dir_all(&bin)?;
    fs::copy(BUSYBOX, bin.join("busybox"))
        .with_context(|| format!("copying {BUSYBOX} (Debian busybox-static)"))?;
    for applet in APPLETS {
        symlink("busybox", bin.join(applet))?;
    }
    Ok(root)
}
