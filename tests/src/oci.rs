//! OCI image archives written by hand (no Docker engine, no registry): a rootfs directory as
//! one layer, its config and manifest, in an OCI layout tarred up for `ctr images import`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};
use serde_json::json;

fn sha256_of(path: &Path) -> anyhow::Result<(String, u64)> {
    let out = Command::new("sha256sum").arg(path).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let digest = text
        .split_whitespace()
        .next()
        .filter(|d| d.len() == 64)
        .with_context(|| format!("sha256sum {}: {text:?}", path.display()))?
        .to_owned();
    Ok((digest, fs::metadata(path)?.len()))
}

/// Writes `blob` under `layout/blobs/sha256/` by its digest; its descriptor.
fn blob(layout: &Path, media_type: &str, bytes: &[u8]) -> anyhow::Result<serde_json::Value> {
    let tmp = layout.join("blob.tmp");
    fs::write(&tmp, bytes)?;
    let (digest, size) = sha256_of(&tmp)?;
    fs::rename(&tmp, layout.join("blobs/sha256").join(&digest))?;
    Ok(json!({"mediaType": media_type, "digest": format!("sha256:{digest}"), "size": size}))
}

/// Writes an OCI image archive of `rootfs` named `image` (its entrypoint and environment
/// given) under `work`, and returns its path. An amd64 image: what this machine runs.
pub fn archive(
    rootfs: &Path,
    work: &Path,
    image: &str,
    entrypoint: &[&str],
    env: &[&str],
) -> anyhow::Result<PathBuf> {
    archive_for(rootfs, work, image, "amd64", entrypoint, env)
}

/// [`archive`] for the OCI `architecture` (`amd64`, `arm64`), in the config and the index.
pub fn archive_for(
    rootfs: &Path,
    work: &Path,
    image: &str,
    architecture: &str,
    entrypoint: &[&str],
    env: &[&str],
) -> anyhow::Result<PathBuf> {
    let layout = work.join("layout");
    fs::create_dir_all(layout.join("blobs/sha256"))?;
    let layer = work.join("layer.tar");
    let out = Command::new("tar")
        .args(["--owner=0", "--group=0", "--numeric-owner", "-cf"])
        .arg(&layer)
        .arg("-C")
        .arg(rootfs)
        .arg(".")
        .output()?;
    if !out.status.success() {
        bail!(
            "tar of the rootfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let layer_bytes = fs::read(&layer)?;
    let layer_desc = blob(
        &layout,
        "application/vnd.oci.image.layer.v1.tar",
        &layer_bytes,
    )?;
    let config = json!({
        "architecture": architecture,
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": env},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
    });
    let config_desc = blob(
        &layout,
        "application/vnd.oci.image.config.v1+json",
        config.to_string().as_bytes(),
    )?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    });
    let mut manifest_desc = blob(
        &layout,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.to_string().as_bytes(),
    )?;
    manifest_desc["annotations"] = json!({
        "io.containerd.image.name": image,
        "org.opencontainers.image.ref.name": image.rsplit(':').next().unwrap_or("test"),
    });
    manifest_desc["platform"] = json!({"architecture": architecture, "os": "linux"});
    fs::write(
        layout.join("index.json"),
        json!({"schemaVersion": 2, "manifests": [manifest_desc]}).to_string(),
    )?;
    fs::write(
        layout.join("oci-layout"),
        json!({"imageLayoutVersion": "1.0.0"}).to_string(),
    )?;
    let archive = work.join("image.tar");
    let out = Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&layout)
        .args(["oci-layout", "index.json", "blobs"])
        .output()?;
    if !out.status.success() {
        bail!(
            "tar of the OCI layout: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(archive)
}
