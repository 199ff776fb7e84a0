//! The cluster tier's image builder makes ipq's arm64 image from the aarch64 build (#38): built
//! and inspected here, not run (this machine runs no arm64 container). `cargo xtask test`
//! builds the aarch64 binaries first (`cargo xtask build --arch arm64`); run alone, the test
//! fails saying which file is missing.

use std::fs;
use std::path::Path;
use std::process::Command;

use ipq_tests::cluster::image::{self, Arch, ImageSource, SHIPPED_BINARIES};

fn tar_extract(archive: &Path, into: &Path) {
    fs::create_dir_all(into).unwrap();
    let out = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tar -xf {}: {}",
        archive.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

/// `sha256:<hex>` → the blob's path in the layout.
fn blob(layout: &Path, digest: &serde_json::Value) -> std::path::PathBuf {
    let digest = digest.as_str().expect("a digest is a string");
    layout
        .join("blobs/sha256")
        .join(digest.strip_prefix("sha256:").expect("a sha256 digest"))
}

#[test]
fn the_arm64_image_says_arm64_and_holds_only_aarch64_executables() {
    let work = std::env::temp_dir().join(format!("ipq-image-arm64-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    let source = ImageSource::cross(Arch::Arm64, "debug");
    let archive = image::build_for(&work, &source).unwrap_or_else(|e| panic!("{e:#}"));

    let layout = work.join("inspect");
    tar_extract(&archive, &layout);
    let index = json(&layout.join("index.json"));
    let manifests = index["manifests"].as_array().unwrap();
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(manifests[0]["platform"]["architecture"], "arm64");
    assert_eq!(manifests[0]["platform"]["os"], "linux");
    let manifest = json(&blob(&layout, &manifests[0]["digest"]));
    let config = json(&blob(&layout, &manifest["config"]["digest"]));
    assert_eq!(config["architecture"], "arm64", "{config}");
    assert_eq!(config["os"], "linux");
    assert_eq!(
        config["config"]["Entrypoint"][0], "/usr/local/bin/ipq-agent",
        "{config}"
    );

    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let rootfs = work.join("unpacked");
    tar_extract(&blob(&layout, &layers[0]["digest"]), &rootfs);
    let aarch64 = Arch::Arm64.elf_machine();
    for name in SHIPPED_BINARIES {
        let path = rootfs.join("usr/local/bin").join(name);
        assert_eq!(image::elf_machine(&path).unwrap(), aarch64, "{name}");
    }
    assert_eq!(
        image::elf_machine(&rootfs.join("bin/busybox")).unwrap(),
        aarch64,
        "the image's shell"
    );
    // The loader the binaries name is in the image, and every library beside it is aarch64.
    let loader = rootfs.join("lib/ld-linux-aarch64.so.1");
    assert_eq!(image::elf_machine(&loader).unwrap(), aarch64);
    let libraries: Vec<_> = fs::read_dir(rootfs.join("lib/aarch64-linux-gnu"))
        .expect("the libraries are where an arm64 Debian keeps them")
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        libraries.iter().any(|l| l.ends_with("libc.so.6")),
        "{libraries:?}"
    );
    for library in &libraries {
        assert_eq!(image::elf_machine(library).unwrap(), aarch64, "{library:?}");
    }
    // Nothing of this machine's architecture slipped in.
    assert!(!rootfs.join("lib/x86_64-linux-gnu").exists());
    assert!(!rootfs.join("lib64").exists());
    fs::remove_dir_all(&work).unwrap();
}

#[test]
fn an_image_of_binaries_for_the_wrong_machine_is_refused_naming_the_file() {
    let work = std::env::temp_dir().join(format!("ipq-image-wrong-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    // The host's own busybox and binaries declared as arm64.
    let host = ImageSource::host_release();
    let wrong = ImageSource {
        arch: Arch::Arm64,
        binaries: host.binaries,
        busybox: host.busybox,
    };
    let err = format!("{:#}", image::build_for(&work, &wrong).unwrap_err());
    assert!(err.contains("/bin/busybox"), "{err}");
    assert!(err.contains("not arm64"), "{err}");
    let _ = fs::remove_dir_all(&work);
}
