//! ADD, CHECK, DEL, GC and STATUS against the agent's API.

use ipq_api::{
    client::{Client, ClientError},
    model::{ClaimRequest, ClaimSource, DrainAttachmentRequest, ErrorCode, GcRequest, HolderSpec},
    Holder, StateName,
};
use ipq_fs::{paths, spool};
use serde_json::Value;

use super::{
    agent_error::{self, describe, is_unavailable, is_worth_spooling},
    config::{NetConf, OnUnavailable},
    env::Env,
    error::{code, CniError},
    host_if,
    result::{pass_on, PrevResult},
};

/// One invocation: the runtime's environment and the plugin's config.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub env: Env,
    pub conf: NetConf,
}

impl Invocation {
    fn client(&self) -> Client {
        Client::new(&self.conf.settings.socket, self.conf.settings.timeout)
    }

    /// `env` checked ADD, CHECK and DEL to carry these.
    fn container_id(&self) -> &str {
        self.env.container_id.as_deref().unwrap_or_default()
    }

    fn prev_result(&self, command: &str) -> Result<&Value, CniError> {
        self.conf.prev_result.as_ref().ok_or_else(|| {
            CniError::new(
                code::INVALID_NETWORK_CONFIG,
                format!(
                    "{command} needs prevResult: ipq-cni is a chained plugin and must follow a \
                     plugin that creates the container's interface (bridge, ptp...)"
                ),
            )
        })
    }

    /// Under `onUnavailable: allow`, logs and carries on; under `fail`, the CNI error.
    fn when_unavailable(&self, err: &ClientError, command: &str) -> Result<(), CniError> {
        match self.conf.settings.on_unavailable {
            OnUnavailable::Fail => Err(agent_error::unavailable(err, command)),
            OnUnavailable::Allow => {
                log::warn!(
                    "{command} of container {} without ipq: the agent is unavailable ({err}) \
                     and onUnavailable is \"allow\"",
                    self.container_id()
                );
                Ok(())
            }
        }
    }

    /// ADD: claims prevResult's addresses for the host-side interface and passes the result on.
    pub async fn add(&self) -> Result<Value, CniError> {
        let prev_value = self.prev_result("ADD")?;
        let prev = PrevResult::parse(prev_value)?;
        let output = pass_on(prev_value, &self.conf.cni_version);
        if prev.addresses.is_empty() {
            log::warn!(
                "ADD of container {}: prevResult has no addresses, nothing to claim",
                self.container_id()
            );
            return Ok(output);
        }
        let interface = host_if::host_interface(&prev)?;
        let request = ClaimRequest {
            addresses: prev.addresses.clone(),
            holder: HolderSpec {
                interface,
                container_id: self.env.container_id.clone(),
                cni_ifname: self.env.ifname.clone(),
                network: self.conf.name.clone(),
                netns: self.env.netns.clone(),
                pod: self.env.pod.clone(),
                mac: sandbox_mac(&prev, self.env.ifname.as_deref()),
            },
            source: ClaimSource::Cni,
        };
        match self.client().claim(&request).await {
            Ok(response) => {
                for conflict in &response.conflicts {
                    log::warn!(
                        "ADD of container {}: {:?} on {} ({}; old holder {})",
                        self.container_id(),
                        conflict.kind,
                        conflict.address,
                        conflict.outcome,
                        conflict
                            .old_holder
                            .as_ref()
                            .map(describe)
                            .unwrap_or_else(|| "unknown".into())
                    );
                }
                Ok(output)
            }
            Err(err) if is_unavailable(&err) => {
                self.when_unavailable(&err, "ADD")?;
                Ok(output)
            }
            Err(ClientError::Api { error, .. }) if error.code == ErrorCode::Refused => {
                Err(agent_error::refused(&error, &prev.addresses))
            }
            Err(err) => Err(agent_error::rejected(&err, "ADD")),
        }
    }

    /// DEL: drains the attachment's addresses; with the agent away, spools the DEL. Never
    /// fails for a missing or unreadable prevResult or namespace.
    pub async fn del(&self) -> Result<(), CniError> {
        let addresses = match self.conf.prev_result.as_ref().map(PrevResult::parse) {
            Some(Ok(prev)) => prev.addresses,
            Some(Err(e)) => {
                log::warn!(
                    "DEL of container {}: ignoring prevResult ({e}); draining by container id",
                    self.container_id()
                );
                Vec::new()
            }
            None => Vec::new(),
        };
        let request = DrainAttachmentRequest {
            container_id: self.container_id().to_owned(),
            cni_ifname: self.env.ifname.clone(),
            addresses,
        };
        match self.client().drain_attachment(&request).await {
            Ok(_) => Ok(()),
            Err(err) if is_worth_spooling(&err) => {
                let dir = paths::cni_spool_dir(&self.conf.settings.state_dir);
                let path = spool::spool(&dir, &request).map_err(|e| {
                    CniError::new(
                        code::IO_FAILURE,
                        format!(
                            "DEL of container {}: the ipq agent is unavailable ({err}) and the \
                             DEL could not be spooled: {e}",
                            request.container_id
                        ),
                    )
                })?;
                log::warn!(
                    "DEL of container {}: the ipq agent is unavailable ({err}); spooled to {} for \
                     the agent to replay when it starts",
                    request.container_id,
                    path.display()
                );
                Ok(())
            }
            Err(err) => Err(agent_error::rejected(&err, "DEL")),
        }
    }

    /// CHECK: every address of prevResult is still held, unfenced, by this attachment.
    pub async fn check(&self) -> Result<(), CniError> {
        let prev = PrevResult::parse(self.prev_result("CHECK")?)?;
        let client = self.client();
        let mut lost = Vec::new();
        for addr in &prev.addresses {
            match client.get(*addr).await {
                Ok(view) => {
                    if let Some(why) =
                        self.claim_lost(view.state, view.holder.as_ref(), view.fenced.as_ref())
                    {
                        lost.push(format!("{addr} {why}"));
                    }
                }
                Err(err) if err.code() == Some(ErrorCode::NotFound) => {
                    lost.push(format!("{addr} is not registered with the agent (free)"));
                }
                Err(err) if is_unavailable(&err) => return self.when_unavailable(&err, "CHECK"),
                Err(err) => return Err(agent_error::rejected(&err, "CHECK")),
            }
        }
        if lost.is_empty() {
            return Ok(());
        }
        Err(CniError::new(
            code::CLAIM_LOST,
            format!(
                "container {} ({}) lost its claim: {}",
                self.container_id(),
                self.env.ifname.as_deref().unwrap_or_default(),
                lost.join("; ")
            ),
        ))
    }

    /// Why an address in `state` with `holder` and `fenced` is not this attachment's, if not.
    fn claim_lost(
        &self,
        state: StateName,
        holder: Option<&Holder>,
        fenced: Option<&Holder>,
    ) -> Option<String> {
        let ours = |h: &Holder| {
            h.container_id() == Some(self.container_id())
                && match (h.cni_ifname(), self.env.ifname.as_deref()) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        };
        if fenced.is_some_and(ours) {
            return Some(format!(
                "is fenced: {} took it",
                holder
                    .map(describe)
                    .unwrap_or_else(|| "a new holder".into())
            ));
        }
        match (state, holder) {
            (StateName::Active | StateName::Draining, Some(h)) if ours(h) => None,
            (StateName::Active | StateName::Draining, Some(h)) => {
                Some(format!("is held by {}", describe(h)))
            }
            (state, _) => Some(format!("is {state}")),
        }
    }

    /// GC: drains what the runtime no longer lists in `cni.dev/valid-attachments`.
    pub async fn gc(&self) -> Result<(), CniError> {
        let valid_attachments = self.conf.valid_attachments.clone().ok_or_else(|| {
            CniError::new(
                code::INVALID_NETWORK_CONFIG,
                "GC needs cni.dev/valid-attachments (without it every attachment would be drained)",
            )
        })?;
        let request = GcRequest {
            valid_attachments,
            network: self.conf.name.clone(),
        };
        match self.client().gc(&request).await {
            Ok(changed) => {
                for view in &changed.addresses {
                    log::info!("GC drained {} ({})", view.address, view.state);
                }
                Ok(())
            }
            Err(err) if is_unavailable(&err) => self.when_unavailable(&err, "GC"),
            Err(err) => Err(agent_error::rejected(&err, "GC")),
        }
    }

    /// STATUS: ready when the agent answers and says it is ready.
    pub async fn status(&self) -> Result<(), CniError> {
        let not_available = |why: String| {
            CniError::new(
                code::PLUGIN_NOT_AVAILABLE,
                format!(
                    "the ipq agent on {} {why}",
                    self.conf.settings.socket.display()
                ),
            )
        };
        match self.client().status().await {
            Ok(status) if status.ready => Ok(()),
            Ok(_) => Err(not_available("is not ready (starting or stopping)".into())),
            Err(err) => Err(not_available(format!("does not answer: {err}"))),
        }
    }
}

/// The MAC of the attachment's interface inside the sandbox (named `CNI_IFNAME`, else the only
/// sandbox interface), for reuse hygiene to announce; none when the result does not say or
/// says something that is not a MAC.
fn sandbox_mac(prev: &super::result::PrevResult, ifname: Option<&str>) -> Option<String> {
    let in_sandbox: Vec<_> = prev
        .interfaces
        .iter()
        .filter(|i| i.sandbox.is_some())
        .collect();
    let chosen = in_sandbox
        .iter()
        .find(|i| Some(i.name.as_str()) == ifname)
        .or_else(|| match in_sandbox[..] {
            [ref only] => Some(only),
            _ => None,
        })?;
    let mac = chosen.mac.as_deref()?;
    if ipq_api::mac::parse_mac(mac).is_none() {
        log::warn!(
            "prevResult: interface {:?} has mac {mac:?}, not a MAC; not passed on",
            chosen.name
        );
        return None;
    }
    Some(mac.to_ascii_lowercase())
}

#[cfg(test)]
mod sandbox_mac_tests {
    use super::{super::result::Interface, sandbox_mac, PrevResult};

    fn iface(name: &str, sandbox: Option<&str>, mac: Option<&str>) -> Interface {
        Interface {
            name: name.into(),
            sandbox: sandbox.map(Into::into),
            mac: mac.map(Into::into),
        }
    }

    #[test]
    fn the_attachments_sandbox_interface_gives_the_mac() {
        let prev = PrevResult {
            addresses: Vec::new(),
            interfaces: vec![
                iface("cni0", None, Some("36:1c:0b:0c:49:3a")),
                iface("veth1", None, Some("4e:01:02:03:04:05")),
                iface("eth0", Some("/var/run/netns/a"), Some("0A:58:0A:58:00:05")),
                iface("net1", Some("/var/run/netns/a"), Some("0a:58:0a:58:00:06")),
            ],
        };
        assert_eq!(
            sandbox_mac(&prev, Some("eth0")).as_deref(),
            Some("0a:58:0a:58:00:05")
        );
        assert_eq!(
            sandbox_mac(&prev, Some("net1")).as_deref(),
            Some("0a:58:0a:58:00:06")
        );
        assert_eq!(sandbox_mac(&prev, Some("eth9")), None, "two candidates");
        let bad = PrevResult {
            addresses: Vec::new(),
            interfaces: vec![iface("eth0", Some("/x"), Some("not-a-mac"))],
        };
        assert_eq!(sandbox_mac(&bad, Some("eth0")), None);
    }
}
