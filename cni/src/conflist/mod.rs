//! `ipq-cni install|uninstall`: puts ipq-cni into the node's existing conflist (and the plugin
//! binary into the CNI bin dir), or takes it out again. The DaemonSet's init container runs
//! `install` on every node.
//!
//! The rules: the active config is the one a runtime would load (the lexically first config
//! file of the conf dir); only a `.conflist` is edited; a file that is not understood is left
//! untouched and the command fails naming it; every write is atomic; a second install changes
//! nothing; an uninstall removes exactly ipq-cni's entry.

mod edit;
mod files;
mod scan;
#[cfg(test)]
mod tests;
mod wrap;

use std::{
    fmt,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::{Args, Parser, Subcommand};
use ipq_api::DEFAULT_SOCKET as DEFAULT_API_SOCKET;

pub use self::{
    edit::{Entry, OnUnavailable, Refusal, PLUGIN_TYPE},
    files::{backup_path, FilesError, BACKUP_SUFFIX},
};
use crate::ipam::config::PLUGIN_TYPE as IPAM_TYPE;

#[derive(Parser)]
#[command(
    name = "ipq-cni",
    about = "Installs ipq-cni into the node's CNI config, or removes it"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Copy the plugin into the CNI bin dir and append it to the active conflist
    Install(InstallArgs),
    /// Remove ipq-cni's entry from the conflist (the binary stays unless --remove-binary)
    Uninstall(UninstallArgs),
}

#[derive(Args)]
struct LocationArgs {
    /// Where the runtime reads CNI configs
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Where the runtime finds CNI plugin binaries
    #[arg(long, default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// Edit this conflist (a name in the conf dir, or a path) instead of the active one
    #[arg(long)]
    conflist: Option<PathBuf>,
}

#[derive(Args)]
struct InstallArgs {
    #[command(flatten)]
    locations: LocationArgs,
    /// The plugin binary to copy (default: this program)
    #[arg(long)]
    binary: Option<PathBuf>,
    /// The agent's API socket, as the plugin sees it on the host
    #[arg(long, default_value = DEFAULT_API_SOCKET)]
    socket: String,
    /// What ADD does when the agent cannot be reached
    #[arg(long, value_enum, default_value = "fail")]
    on_unavailable: OnUnavailable,
    /// The agent's `state_dir`, where the plugins spool DELs and held releases while the agent
    /// is away (written into the config only when not the default)
    #[arg(long, default_value = ipq_api::DEFAULT_STATE_DIR)]
    state_dir: String,
    /// Also wrap the main plugin's `ipam` section in ipq-ipam, so that the node's IPAM keeps a
    /// deleted pod's address allocated until its quarantine is over (without the flag, a
    /// wrapped section is unwrapped)
    #[arg(long)]
    hold_ipam: bool,
    /// The ipq-ipam binary to copy with --hold-ipam (default: `ipq-ipam` beside --binary)
    #[arg(long)]
    ipam_binary: Option<PathBuf>,
}

#[derive(Args)]
struct UninstallArgs {
    #[command(flatten)]
    locations: LocationArgs,
    /// Also delete the plugin binary. Off by default: runtimes run the plugin named in the
    /// config a pod was created with for its DEL, so pods created while ipq-cni was installed
    /// need the binary until they are gone.
    #[arg(long)]
    remove_binary: bool,
}

/// Where the installer works.
#[derive(Clone, Debug)]
pub struct Locations {
    pub conf_dir: PathBuf,
    pub bin_dir: PathBuf,
    /// A conflist to edit instead of the active config.
    pub conflist: Option<PathBuf>,
}

/// What an install or uninstall did, one line each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub config: PathBuf,
    pub config_changed: bool,
    pub binary_changed: bool,
    pub lines: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.lines {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

/// The conflist to edit: `--conflist`, else the active config, which must be a `.conflist`.
fn target(locations: &Locations, report: &mut Report) -> Result<PathBuf, FilesError> {
    let active = files::active_config(&locations.conf_dir);
    let path = match &locations.conflist {
        Some(named) => {
            let path = locations.conf_dir.join(named);
            if let Ok(active) = &active {
                if *active != path {
                    report.lines.push(format!(
                        "note: {} sorts first in {} and is the config runtimes use, not {}",
                        active.display(),
                        locations.conf_dir.display(),
                        path.display()
                    ));
                }
            }
            path
        }
        None => active?,
    };
    if !files::is_conflist(&path) {
        return Err(FilesError::Refused {
            path,
            reason: Refusal::SinglePluginFile,
        });
    }
    report.config = path.clone();
    Ok(path)
}

fn refused(path: &Path) -> impl FnOnce(Refusal) -> FilesError + '_ {
    move |reason| FilesError::Refused {
        path: path.to_owned(),
        reason,
    }
}

/// What `install` puts in the bin dir: ipq-cni, and with `--hold-ipam` ipq-ipam.
pub struct Binaries<'a> {
    pub cni: &'a Path,
    /// `Some` exactly with `--hold-ipam`.
    pub ipam: Option<&'a Path>,
}

/// Copies the binaries into the bin dir and appends `entry` to the conflist (and, with
/// `binaries.ipam`, wraps the main plugin's `ipam` in ipq-ipam; without it, unwraps it).
/// Nothing is written when the conflist is refused.
pub fn install(
    locations: &Locations,
    binaries: &Binaries<'_>,
    entry: &Entry,
) -> Result<Report, FilesError> {
    let mut report = Report::default();
    let path = target(locations, &mut report)?;
    let text = files::read_config(&path)?;
    let outcome = edit::install(&text, entry).map_err(refused(&path))?;
    let chained = match &outcome {
        edit::Installed::AlreadyPresent => text.clone(),
        edit::Installed::Inserted(new) | edit::Installed::Updated(new) => new.clone(),
    };
    let held = match binaries.ipam {
        Some(_) => wrap::wrap(&chained, &entry.socket, entry.state_dir.as_deref()),
        None => wrap::unwrap(&chained),
    }
    .map_err(|e| refused(&path)(e.into()))?;

    // The binaries first: a runtime must never find a plugin in the config without its binary.
    report.binary_changed = files::install_binary(binaries.cni, &locations.bin_dir)?;
    let bin = locations.bin_dir.join(PLUGIN_TYPE);
    report.lines.push(if report.binary_changed {
        format!(
            "installed {} from {}",
            bin.display(),
            binaries.cni.display()
        )
    } else {
        format!("{} is up to date", bin.display())
    });
    if let Some(ipam) = binaries.ipam {
        let changed = files::install_binary_as(ipam, &locations.bin_dir, IPAM_TYPE)?;
        report.binary_changed |= changed;
        let bin = locations.bin_dir.join(IPAM_TYPE);
        report.lines.push(if changed {
            format!("installed {} from {}", bin.display(), ipam.display())
        } else {
            format!("{} is up to date", bin.display())
        });
    }
    let outcome = match (outcome, held) {
        (outcome, None) => outcome,
        (edit::Installed::Inserted(_), Some(new)) => edit::Installed::Inserted(new),
        (_, Some(new)) => {
            report.lines.push(match binaries.ipam {
                Some(_) => format!("wrapped the main plugin's ipam section in {IPAM_TYPE}"),
                None => format!("unwrapped the main plugin's ipam section from {IPAM_TYPE}"),
            });
            edit::Installed::Updated(new)
        }
    };

    match outcome {
        edit::Installed::AlreadyPresent => report.lines.push(format!(
            "{} already chains {PLUGIN_TYPE} last with these settings: nothing changed",
            path.display()
        )),
        edit::Installed::Inserted(new) => {
            let backup = backup_path(&path);
            files::write_atomically(&backup, text.as_bytes(), 0o644)?;
            files::write_atomically(&path, new.as_bytes(), 0o644)?;
            report.config_changed = true;
            report.lines.push(format!(
                "appended {PLUGIN_TYPE} to the plugins of {} (the original is kept in {})",
                path.display(),
                backup.display()
            ));
        }
        edit::Installed::Updated(new) => {
            files::write_atomically(&path, new.as_bytes(), 0o644)?;
            report.config_changed = true;
            report.lines.push(format!(
                "updated the {PLUGIN_TYPE} entry of {} (now last, with these settings)",
                path.display()
            ));
        }
    }
    if text.contains("\"cilium-cni\"") {
        report.lines.push(format!(
            "note: Cilium rewrites {} when its agent starts unless its Helm value \
             cni.customConf is true; restarting ipq's pod on the node runs this install again",
            path.display()
        ));
    }
    Ok(report)
}

/// Removes ipq-cni's entry from the conflist; with `remove_binary`, the binary too.
pub fn uninstall(locations: &Locations, remove_binary: bool) -> Result<Report, FilesError> {
    let mut report = Report::default();
    let path = target(locations, &mut report)?;
    let text = files::read_config(&path)?;
    let backup = backup_path(&path);
    let unwrapped = wrap::unwrap(&text).map_err(|e| refused(&path)(e.into()))?;
    let base = unwrapped.as_deref().unwrap_or(&text);
    let removed = edit::uninstall(base).map_err(refused(&path))?;
    let removed = match (removed, unwrapped.is_some()) {
        (None, true) => Some(base.to_owned()),
        (removed, _) => removed,
    };
    if unwrapped.is_some() {
        report.lines.push(format!(
            "unwrapped the main plugin's ipam section from {IPAM_TYPE}"
        ));
    }
    match removed {
        None => report.lines.push(format!(
            "{} does not chain {PLUGIN_TYPE}: nothing changed",
            path.display()
        )),
        Some(new) => {
            files::write_atomically(&path, new.as_bytes(), 0o644)?;
            report.config_changed = true;
            report.lines.push(format!(
                "removed {PLUGIN_TYPE} from the plugins of {}",
                path.display()
            ));
            match std::fs::read(&backup) {
                Ok(original) if original == new.as_bytes() => {
                    files::remove_if_present(&backup)?;
                    report
                        .lines
                        .push("the file is byte for byte what it was before install".into());
                }
                Ok(_) => report.lines.push(format!(
                    "the file changed since install; the pre-install copy stays in {}",
                    backup.display()
                )),
                Err(_) => {}
            }
        }
    }
    if remove_binary {
        for name in [PLUGIN_TYPE, IPAM_TYPE] {
            let bin = locations.bin_dir.join(name);
            if files::remove_if_present(&bin)? {
                report.binary_changed = true;
                report.lines.push(format!("removed {}", bin.display()));
            }
        }
    }
    Ok(report)
}

/// `ipq-cni install|uninstall ...`: `args` are the arguments after the program name.
pub fn main(args: Vec<String>) -> ExitCode {
    let cli = match Cli::try_parse_from(std::iter::once("ipq-cni".to_owned()).chain(args)) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let locations = |l: LocationArgs| Locations {
        conf_dir: l.cni_conf_dir,
        bin_dir: l.cni_bin_dir,
        conflist: l.conflist,
    };
    let (verb, result) = match cli.command {
        Command::Install(args) => {
            let binary = match args.binary.map_or_else(std::env::current_exe, Ok) {
                Ok(binary) => binary,
                Err(e) => {
                    eprintln!("ipq-cni install: cannot find this program's path: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let ipam_binary = args.hold_ipam.then(|| {
                args.ipam_binary
                    .clone()
                    .unwrap_or_else(|| binary.with_file_name(IPAM_TYPE))
            });
            let entry = Entry {
                socket: args.socket,
                on_unavailable: args.on_unavailable,
                state_dir: (args.state_dir != ipq_api::DEFAULT_STATE_DIR).then_some(args.state_dir),
            };
            let binaries = Binaries {
                cni: &binary,
                ipam: ipam_binary.as_deref(),
            };
            (
                "install",
                install(&locations(args.locations), &binaries, &entry),
            )
        }
        Command::Uninstall(args) => (
            "uninstall",
            uninstall(&locations(args.locations), args.remove_binary),
        ),
    };
    match result {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ipq-cni {verb}: {e}");
            ExitCode::FAILURE
        }
    }
}
