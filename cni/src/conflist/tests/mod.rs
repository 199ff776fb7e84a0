//! The installer against real-world conflists (`tests/fixtures/conflists/`), each in a conf dir
//! of its own.

mod command_line;
mod hold_ipam;
mod later_runs;
mod refusals;
mod round_trip;

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use serde_json::Value;

use super::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/conflists");

/// The conflists the CNIs people run write; each must take the entry and give it back.
const REAL_WORLD: [&str; 6] = [
    "10-containerd-net.conflist",
    "20-ptp.conflist",
    "10-calico.conflist",
    "05-cilium.conflist",
    "05-cilium-aws-chaining.conflist",
    "30-compact.conflist",
];

fn fixture(name: &str) -> String {
    fs::read_to_string(Path::new(FIXTURES).join(name))
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

/// A conf dir, a bin dir and a plugin binary in a temp dir.
struct Node {
    _dir: tempfile::TempDir,
    conf: PathBuf,
    bin: PathBuf,
    binary: PathBuf,
}

impl Node {
    fn with(files: &[(&str, &str)]) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("net.d");
        let bin = dir.path().join("bin");
        fs::create_dir_all(&conf).unwrap();
        fs::create_dir_all(&bin).unwrap();
        for (name, text) in files {
            fs::write(conf.join(name), text).unwrap();
        }
        let binary = dir.path().join("ipq-cni-build");
        fs::write(&binary, b"\x7fELF pretend plugin").unwrap();
        Node {
            _dir: dir,
            conf,
            bin,
            binary,
        }
    }

    fn fixture(name: &str) -> Node {
        Node::with(&[(name, &fixture(name))])
    }

    fn locations(&self) -> Locations {
        Locations {
            conf_dir: self.conf.clone(),
            bin_dir: self.bin.clone(),
            conflist: None,
        }
    }

    fn install(&self) -> Result<Report, FilesError> {
        install(&self.locations(), &self.binaries(false), &entry())
    }

    fn binaries(&self, hold_ipam: bool) -> Binaries<'_> {
        Binaries {
            cni: &self.binary,
            ipam: hold_ipam.then_some(self.binary.as_path()),
        }
    }

    fn uninstall(&self) -> Result<Report, FilesError> {
        uninstall(&self.locations(), false)
    }

    fn read(&self, name: &str) -> String {
        fs::read_to_string(self.conf.join(name)).unwrap()
    }

    fn conf_names(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.conf)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

fn entry() -> Entry {
    Entry {
        socket: "/run/ipq/ipq.sock".into(),
        on_unavailable: OnUnavailable::Fail,
        state_dir: None,
    }
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

fn plugins(doc: &Value) -> &Vec<Value> {
    doc["plugins"].as_array().expect("a plugins array")
}
