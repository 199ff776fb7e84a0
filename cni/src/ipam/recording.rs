//! ADD's record of its allocation (issue 27): what a later release of it will run, handed to
//! the agent (`POST /v1/ipam/allocations`) or, with the agent away, written where the agent
//! keeps its records. A release can then only complete what an ADD began.

use std::net::IpAddr;

use ipq_api::{
    client::{Client, ClientError},
    model::{AllocationRecord, ErrorCode},
};

use ipq_fs::{paths, records};

use super::{
    super::{
        agent_error::{self, is_worth_spooling},
        env::Env,
        error::{code, CniError},
    },
    config::IpamConf,
    plugin::{cni_path, runtime},
};

/// The record of the allocation of `addresses` that the delegate's ADD made for
/// `container_id` (the pod's, or a parking id) with `cni_args`.
pub fn of(
    env: &Env,
    conf: &IpamConf,
    container_id: &str,
    cni_args: Option<String>,
    addresses: &[IpAddr],
) -> Result<AllocationRecord, CniError> {
    Ok(AllocationRecord {
        network: conf.network.clone(),
        cni_version: conf.cni_version.clone(),
        delegate_type: conf.delegate_type.clone(),
        delegate_conf: conf.delegate_conf.clone(),
        container_id: container_id.to_owned(),
        ifname: env.ifname.clone().unwrap_or_default(),
        cni_args,
        cni_path: cni_path(env)?.to_owned(),
        netns: env.netns.clone(),
        addresses: addresses.to_vec(),
    })
}

/// Hands `record` to the agent, or writes it for the agent when it is away (or too old to
/// take it). A full table of records is code 11 (try again later); a record the agent refuses
/// fails the ADD naming why.
pub fn record(record: &AllocationRecord, conf: &IpamConf) -> Result<(), CniError> {
    let client = Client::new(&conf.settings.socket, conf.settings.timeout);
    match runtime()?.block_on(client.record_allocation(record)) {
        Ok(_) => Ok(()),
        Err(err) if err.code() == Some(ErrorCode::RegistryFull) => Err(CniError::new(
            code::TRY_AGAIN_LATER,
            format!(
                "ADD of container {}: the ipq agent keeps no more allocation records: {}",
                record.container_id,
                detail(&err)
            ),
        )),
        // An agent older than the records (a rollback, a rollout mid-way) has no such route:
        // the file waits for one that adopts it, and the ADD does not fail on the version skew.
        Err(err) if is_worth_spooling(&err) || err.code() == Some(ErrorCode::NotFound) => {
            let dir = paths::ipam_allocation_dir(&conf.settings.state_dir);
            records::write(&dir, record).map_err(|e| {
                CniError::new(
                    code::IO_FAILURE,
                    format!(
                        "ADD of container {}: the ipq agent is unavailable ({err}) and the record \
                         of the allocation could not be written: {e}",
                        record.container_id
                    ),
                )
            })?;
            log::warn!(
                "ADD of container {}: the ipq agent is unavailable ({err}); the record of {:?} is \
                 written for it",
                record.container_id,
                record.addresses
            );
            Ok(())
        }
        Err(err) => Err(agent_error::rejected(&err, "ADD")),
    }
}

fn detail(err: &ClientError) -> String {
    match err {
        ClientError::Api { error, .. } => error.message.clone(),
        other => other.to_string(),
    }
}
