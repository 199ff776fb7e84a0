//! `ipq-agent`: the node agent. `ipq-agent --config FILE` runs it; `ipq-agent datapath ...`
//! inspects or repairs the pinned datapath directly (break-glass, works with no agent running);
//! `ipq-agent probe healthz|readyz` is the kubelet's exec probe of a running agent.

use std::{net::IpAddr, path::PathBuf, process::ExitCode};
use strum::VariantArray as _;

use anyhow::{bail, Context as _};
use clap::{Args, Parser, Subcommand};
use ipq::{
    config::{keys, Config, Overrides},
    datapath::{lock, DatapathMaps, PinnedReading},
    hygiene, netdev, paths,
    registry::StateName,
};
use ipq_api::EntryState;
use ipq_common::{
    addr::{AddrEntry, AddrKey, AddrState, NO_IFINDEX},
    counters::{counter_index, Action, Hook, Reason},
};

#[derive(Parser)]
#[command(
    name = "ipq-agent",
    version,
    about = "ipq node agent: IP quarantine in the kernel datapath"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Args, Default)]
struct RunArgs {
    /// Configuration file; without it, /etc/ipq/agent.toml if it exists, else built-in defaults.
    #[arg(long, short)]
    config: Option<PathBuf>,
    #[command(flatten)]
    keys: KeyFlags,
}

/// One flag per configuration key, made from the key table (`ipq::config::keys`), so a key
/// added there is a flag here with nothing else to change.
#[derive(Clone, Debug, Default)]
struct KeyFlags(Vec<(&'static str, String)>);

impl clap::FromArgMatches for KeyFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        Ok(Self(
            keys::KEYS
                .iter()
                .flat_map(|k| {
                    matches
                        .get_many::<String>(k.name)
                        .into_iter()
                        .flatten()
                        .map(|value| (k.name, value.clone()))
                })
                .collect(),
        ))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for KeyFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.args(keys::KEYS.iter().map(|k| {
            let arg = clap::Arg::new(k.name).long(k.flag).help(k.help);
            let arg = match k.alias {
                Some(alias) => arg.visible_alias(alias),
                None => arg,
            };
            match k.kind {
                keys::Kind::List => arg.action(clap::ArgAction::Append),
                _ => arg,
            }
        }))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl RunArgs {
    fn overrides(&self) -> Overrides {
        Overrides {
            values: self.keys.0.clone(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Inspect or repair the pinned datapath maps directly.
    #[command(subcommand)]
    Datapath(DatapathCommand),
    /// Ask the running agent's /healthz or /readyz over its API socket (the kubelet's exec
    /// probe: root's connections there are kept for root, whoever else holds the others).
    Probe {
        #[arg(value_enum)]
        probe: ipq::api::probe::Probe,
        #[arg(long, default_value = ipq_api::DEFAULT_SOCKET)]
        api_socket: PathBuf,
        /// Longest wait for each read and write.
        #[arg(long, default_value = "4s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
}

#[derive(Subcommand)]
enum DatapathCommand {
    /// Every address in the datapath, and the drop counters.
    Show {
        #[arg(long, default_value = paths::DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
    },
    /// Writes one address entry.
    Set {
        addr: IpAddr,
        #[arg(long, value_enum)]
        state: StateName,
        /// Interface of the holder whose traffic flows.
        #[arg(long)]
        holder: Option<String>,
        /// Interface whose packets with this address are dropped both ways.
        #[arg(long)]
        fenced: Option<String>,
        #[arg(long, default_value = paths::DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
    },
    /// Removes one address entry (the address becomes free).
    Delete {
        addr: IpAddr,
        #[arg(long, default_value = paths::DEFAULT_BPFFS_DIR)]
        bpffs_dir: PathBuf,
    },
}

fn ifindex_of(name: &Option<String>, what: &str) -> anyhow::Result<u32> {
    match name {
        None => Ok(NO_IFINDEX),
        Some(name) => netdev::ifindex(name)
            .with_context(|| format!("{what} interface {name:?} does not exist")),
    }
}

/// The lock of `bpffs_dir` for a break-glass write: refused, naming the agent, while one runs
/// (it is the maps' one writer).
fn write_lock(bpffs_dir: &std::path::Path, addr: &IpAddr) -> anyhow::Result<lock::BpffsLock> {
    match lock::acquire(bpffs_dir) {
        Ok(lock) => Ok(lock),
        Err(lock::LockError::Held { holder, .. }) => bail!(
            "{}: an ipq-agent ({}) runs on it and is the one writer of its maps; write through \
             it instead (PUT or DELETE /v1/datapath/{addr} on its API socket; claims, drains \
             and releases with `ipq`), or stop the agent first",
            bpffs_dir.display(),
            holder.map_or_else(|| "pid unknown".to_owned(), |pid| format!("pid {pid}"))
        ),
        Err(e) => Err(e.into()),
    }
}

fn datapath_command(command: DatapathCommand) -> anyhow::Result<()> {
    match command {
        DatapathCommand::Show { bpffs_dir } => {
            // Reads only: an agent may be writing these maps right now.
            let PinnedReading { entries, counters } = DatapathMaps::read_pinned(&bpffs_dir)?;
            println!(
                "{:<40} {:<12} {:>7} {:>7}",
                "ADDRESS", "STATE", "HOLDER", "FENCED"
            );
            for (addr, entry) in entries {
                let state = EntryState::of_raw(entry.state());
                println!(
                    "{:<40} {:<12} {:>7} {:>7}",
                    addr.to_ip().to_string(),
                    state,
                    entry.holder_ifindex,
                    entry.fenced_ifindex
                );
            }
            for &action in Action::VARIANTS {
                for &hook in Hook::VARIANTS {
                    for &reason in Reason::VARIANTS {
                        let c = counters[counter_index(action, hook, reason) as usize];
                        if c.packets > 0 {
                            println!(
                                "{} {} {}: {} packets, {} bytes",
                                action, hook, reason, c.packets, c.bytes
                            );
                        }
                    }
                }
            }
        }
        DatapathCommand::Set {
            addr,
            state,
            holder,
            fenced,
            bpffs_dir,
        } => {
            let state = state
                .entry()
                .context("--state free: a free address has no entry; use `delete`")?;
            let holder = ifindex_of(&holder, "holder")?;
            let fenced = ifindex_of(&fenced, "fenced")?;
            if state != AddrState::Quarantined && holder == NO_IFINDEX {
                bail!("--holder is required for an {} address", state);
            }
            let _lock = write_lock(&bpffs_dir, &addr)?;
            let mut maps = DatapathMaps::open_pinned(&bpffs_dir)?;
            let entry = AddrEntry::new(state, holder, netdev::monotonic_ns()).with_fenced(fenced);
            maps.table.put(AddrKey::from(addr), entry)?;
            println!("{addr}: {} holder if{holder} fenced if{fenced}", state);
        }
        DatapathCommand::Delete { addr, bpffs_dir } => {
            let _lock = write_lock(&bpffs_dir, &addr)?;
            let mut maps = DatapathMaps::open_pinned(&bpffs_dir)?;
            match maps.table.remove(&AddrKey::from(addr))? {
                Some(_) => println!("{addr}: removed"),
                None => bail!("{addr} is not in the datapath"),
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // The start-up probe of reuse hygiene re-executes the agent into a throwaway network
    // namespace (ipq::hygiene's flush_probe); that child does only this.
    if std::env::args_os().nth(1).as_deref() == Some(hygiene::CONNTRACK_PROBE_ARG.as_ref()) {
        return ExitCode::from(hygiene::conntrack_probe_main() as u8);
    }
    ipq::heap::tune();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Datapath(command)) => datapath_command(command),
        Some(Command::Probe {
            probe,
            api_socket,
            timeout,
        }) => ipq::api::probe::ask(&api_socket, probe, timeout)
            .map(|body| print!("{body}"))
            .map_err(anyhow::Error::from),
        None => run(cli.run),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ipq-agent: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref(), &args.overrides())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(ipq::agent::run(config))?;
    Ok(())
}
