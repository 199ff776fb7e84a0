//! Pool pressure (`ipam_on_exhausted`): ipq-ipam's delegate found a network's range used up.
//! The loop looks at the held allocations of that network (O(held addresses of the network),
//! bounded by the range's size, not the registry's) and either answers "wait" or hands the
//! quietest releasable allocation to the releaser, which runs its DEL and answers.

use std::{collections::BTreeMap, net::IpAddr};

use ipq_api::OnExhausted;
use log::warn;

use super::{ipam::IpamSide, observer::Observer};
use crate::{
    api::{
        command::Reply,
        model::{EventBody, ExhaustedAnswer, ExhaustedRequest},
        views::TimeBase,
    },
    ipam::releaser::Urgent,
    metrics::Metrics,
    netdev,
    registry::{AddrStatus, MonoNs, Registry},
};

/// One held allocation of the network, as the registry has its addresses.
#[derive(Default)]
struct Allocation {
    addresses: Vec<IpAddr>,
    /// An address of it has a live (Draining or Active) holder: never released early.
    live: bool,
    /// The latest moment any of its addresses saw traffic (stale, or its holder's going).
    quiet_since: MonoNs,
}

impl IpamSide {
    /// Answers `request` now (wait, nothing held) or through the releaser (release-quietest),
    /// by `policy`, from what `registry` has of the network's held addresses; published as an
    /// event and counted.
    pub(super) fn exhausted(
        &self,
        request: ExhaustedRequest,
        reply: Reply<ExhaustedAnswer>,
        policy: OnExhausted,
        registry: &Registry,
        (metrics, observer): (&Metrics, &mut Observer),
    ) {
        let mut answer = ExhaustedAnswer {
            policy,
            quarantined: 0,
            draining: 0,
            next_release: None,
            released: Vec::new(),
        };
        let mut allocations: BTreeMap<(String, String), Allocation> = BTreeMap::new();
        let mut next: Option<MonoNs> = None;
        for (addr, hold) in self.holds.all() {
            if hold.network != request.network {
                continue;
            }
            let allocation = allocations
                .entry((hold.container_id, hold.ifname))
                .or_default();
            allocation.addresses.push(addr);
            match registry.records().get(addr).map(|r| &r.status) {
                // Free already: the releaser gives it back within a second.
                None => {}
                Some(AddrStatus::Quarantined {
                    since,
                    until,
                    last_stale,
                    ..
                }) => {
                    answer.quarantined += 1;
                    let quiet = last_stale.unwrap_or(*since);
                    allocation.quiet_since = allocation.quiet_since.max(quiet);
                    next = Some(next.map_or(*until, |n| n.min(*until)));
                }
                Some(AddrStatus::Draining { .. } | AddrStatus::Active { .. }) => {
                    answer.draining += 1;
                    allocation.live = true;
                }
            }
        }
        answer.next_release = next.map(|at| TimeBase::now().rfc3339(at));
        if allocations.is_empty() {
            // Nothing of this range is ipq's: the delegate's own error stands.
            let _ = reply.send(Ok(answer));
            return;
        }
        let quietest = quietest(allocations);
        let chosen = match (policy, quietest) {
            (OnExhausted::ReleaseQuietest, Some(((container_id, ifname), allocation))) => {
                Some((container_id, ifname, allocation.addresses))
            }
            _ => None,
        };
        let network = request.network.clone();
        let Some((container_id, ifname, addresses)) = chosen else {
            let outcome = if policy == OnExhausted::Wait {
                "waited"
            } else {
                "none_releasable"
            };
            let label = metrics.ipam.event_network_label(Some(&network));
            metrics
                .ipam_exhausted
                .with_label_values(&[label.as_str(), outcome])
                .inc();
            publish_exhausted(observer, &request, &answer);
            let _ = reply.send(Ok(answer));
            return;
        };
        answer.released = addresses;
        publish_exhausted(observer, &request, &answer);
        let urgent = Urgent {
            network,
            container_id,
            ifname,
            answer,
            reply,
        };
        let Some(queue) = self.urgent() else {
            warn!(
                "ipam: no releaser runs; the exhausted range of {:?} waits",
                request.network
            );
            return answer_unreleased(urgent);
        };
        if let Err(e) = queue.try_send(urgent) {
            warn!(
                "ipam: the releaser is busy or gone; the exhausted range of {:?} waits",
                request.network
            );
            answer_unreleased(e.into_inner());
        }
    }
}

/// The exhausted range as an event.
fn publish_exhausted(
    observer: &mut Observer,
    request: &ExhaustedRequest,
    answer: &ExhaustedAnswer,
) {
    let at = TimeBase::now().rfc3339(netdev::monotonic_ns());
    observer.publish(
        at,
        EventBody::IpamExhausted {
            network: request.network.clone(),
            container_id: request.container_id.clone(),
            answer: answer.clone(),
        },
    );
}

/// The release could not be asked for: ipq-ipam hears "wait".
fn answer_unreleased(mut urgent: Urgent) {
    urgent.answer.released.clear();
    let _ = urgent.reply.send(Ok(urgent.answer));
}

/// The allocation `release-quietest` gives back: never one with a live (Active or Draining)
/// holder on any of its addresses; of the others, the one whose latest traffic (stale, or its
/// holder's going) is the oldest.
fn quietest(
    allocations: BTreeMap<(String, String), Allocation>,
) -> Option<((String, String), Allocation)> {
    allocations
        .into_iter()
        .filter(|(_, a)| !a.live)
        .min_by_key(|(_, a)| a.quiet_since)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocation(live: bool, quiet_since: MonoNs) -> Allocation {
        Allocation {
            addresses: Vec::new(),
            live,
            quiet_since,
        }
    }

    #[test]
    fn the_quietest_quarantined_allocation_goes_never_a_live_holders() {
        let key = |c: &str| (c.to_owned(), "eth0".to_owned());
        let allocations = BTreeMap::from([
            // Quiet the longest, but its holder still drains.
            (key("draining"), allocation(true, 10)),
            (key("recent"), allocation(false, 300)),
            (key("quietest"), allocation(false, 50)),
            (key("middle"), allocation(false, 120)),
        ]);
        let chosen = quietest(allocations).map(|(k, _)| k.0);
        assert_eq!(chosen.as_deref(), Some("quietest"));

        let only_live = BTreeMap::from([(key("a"), allocation(true, 1))]);
        assert!(quietest(only_live).is_none(), "nothing releasable");
    }
}
