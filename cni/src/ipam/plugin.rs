//! One run of `ipq-ipam`: environment and stdin in, what to print and the exit status out.

use std::ffi::OsString;

use ipq_api::client::{Client, ClientError};
use ipq_fs::{paths, spool};

use super::{
    super::{
        agent_error::{self, is_worth_spooling},
        config::{version_hint, LATEST_VERSION},
        env::{Command, Env},
        error::{code, CniError},
        plugin::{version, Outcome},
        result::PrevResult,
    },
    add,
    config::IpamConf,
    delegate, gc,
    release::HeldRelease,
};

/// Runs the command `var` names with config `stdin`.
pub fn run(var: impl Fn(&str) -> Option<OsString>, stdin: &[u8]) -> Outcome {
    let error_version = version_hint(stdin);
    match dispatch(&var, stdin) {
        Ok(stdout) => Outcome::ok(stdout),
        Err(err) => {
            log::debug!("{err}");
            Outcome::error(&err, error_version.as_deref().unwrap_or(LATEST_VERSION))
        }
    }
}

fn dispatch(var: &impl Fn(&str) -> Option<OsString>, stdin: &[u8]) -> Result<String, CniError> {
    let env = Env::from_lookup(var)?;
    if env.command == Command::Version {
        return version(stdin);
    }
    let conf = IpamConf::parse(stdin)?;
    match env.command {
        Command::Add => add::add(var, &env, &conf),
        Command::Check => pass_through(&env, &conf),
        Command::Del => hold(var, &env, &conf).map(|()| String::new()),
        Command::Gc => gc::gc(&env, &conf),
        Command::Status => gc::status(&env, &conf),
        Command::Version => version(stdin),
    }
}

pub(super) fn runtime() -> Result<tokio::runtime::Runtime, CniError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::new(code::INTERNAL, format!("starting the async runtime: {e}")))
}

/// `CNI_PATH`, which `Env` requires for ADD, CHECK, DEL and GC; STATUS may come without.
pub(super) fn cni_path(env: &Env) -> Result<&str, CniError> {
    env.path.as_deref().ok_or_else(|| {
        CniError::new(
            code::INVALID_ENVIRONMENT,
            format!(
                "CNI_PATH is missing: {} needs it to find the delegate",
                env.command.as_ref()
            ),
        )
    })
}

/// CHECK: the delegate's answer, as the runtime would have had it.
fn pass_through(env: &Env, conf: &IpamConf) -> Result<String, CniError> {
    let binary = delegate::find(cni_path(env)?, &conf.delegate_type)?;
    let stdin = conf.delegate_conf.to_string();
    let stdout = delegate::exec(&conf.delegate_type, &binary, &[], stdin.as_bytes())?;
    Ok(stdout.trim_end().to_owned())
}

/// DEL: never the delegate's DEL. The release is handed to the agent, which stores it durably
/// and runs the delegate's DEL once the addresses' quarantine is over; with the agent away it
/// is spooled under `stateDir` (where the agent keeps its own), so it is never lost and never
/// becomes an early release. Succeeds only once the release is on disk.
fn hold(
    var: &impl Fn(&str) -> Option<OsString>,
    env: &Env,
    conf: &IpamConf,
) -> Result<(), CniError> {
    let addresses = match conf.prev_result.as_ref().map(PrevResult::parse) {
        Some(Ok(prev)) => prev.addresses,
        Some(Err(e)) => {
            log::warn!("DEL: ignoring prevResult ({e}); the agent goes by its own record");
            Vec::new()
        }
        None => Vec::new(),
    };
    let release = HeldRelease {
        network: conf.network.clone(),
        cni_version: conf.cni_version.clone(),
        delegate_type: conf.delegate_type.clone(),
        delegate_conf: conf.delegate_conf.clone(),
        container_id: env.container_id.clone().unwrap_or_default(),
        ifname: env.ifname.clone().unwrap_or_default(),
        cni_args: var("CNI_ARGS").and_then(|v| v.into_string().ok()),
        cni_path: cni_path(env)?.to_owned(),
        netns: env.netns.clone(),
        addresses,
        held_at_unix_ms: super::release::now_unix_ms(),
        // The agent stamps what it stores with its boot and CLOCK_BOOTTIME; one spooled here
        // while it is away waits from when the agent first sees it (the safe side).
        held_at_boot: None,
    };
    hand_over(&release, conf)
}

/// Hands `release` to the agent, or spools it when the agent is away; Ok once it is on disk.
/// A release the agent refuses (its delegate outside the agent's `ipam_cni_bin_dirs`) fails
/// the DEL, naming why: spooled, it would only wait for a DEL the agent will not run, and run
/// here it would free the address early. Failing, the DEL is retried by the runtime and the
/// allocation stays held in the delegate until the operator trusts the directory.
pub(super) fn hand_over(release: &HeldRelease, conf: &IpamConf) -> Result<(), CniError> {
    let client = Client::new(&conf.settings.socket, conf.settings.timeout);
    match runtime()?.block_on(client.hold_release(release)) {
        Ok(stored) => {
            log::info!(
                "DEL of container {}: the agent holds the release of {:?}",
                stored.container_id,
                stored.addresses
            );
            Ok(())
        }
        Err(err) if is_worth_spooling(&err) => spool_release(release, conf, &err),
        Err(err) => Err(agent_error::rejected(&err, "DEL")),
    }
}

/// The agent is away: the release goes where the agent keeps its own, written durably.
fn spool_release(
    release: &HeldRelease,
    conf: &IpamConf,
    err: &ClientError,
) -> Result<(), CniError> {
    let dir = paths::ipam_release_dir(&conf.settings.state_dir);
    let path = spool::spool(&dir, release).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            format!(
                "DEL of container {}: the ipq agent is unavailable ({err}) and the release of \
                 its allocation could not be held: {e}",
                release.container_id
            ),
        )
    })?;
    log::warn!(
        "DEL of container {}: the ipq agent is unavailable ({err}); the release of {:?} is \
         held in {} for the agent",
        release.container_id,
        release.addresses,
        path.display()
    );
    Ok(())
}
