//! What changed in the registry, handed to the NodeQuarantine publisher (`crate::publish`)
//! and, when enabled, to its projection into whereabouts' reservations ([`Publishing`]): each
//! changed address's entry as it is now, O(1) per address; they do the rest off this loop.

use super::Tracker;
use crate::{
    publish::{whereabouts, Change, Feed, PublishedEntry},
    registry::Registry,
};

/// The publisher's end and the whereabouts projection's, when the agent publishes.
#[derive(Default)]
pub(super) struct Publishing {
    /// The NodeQuarantine publisher's end.
    pub(super) publish: Option<Feed>,
    /// The whereabouts projection's end, when enabled.
    pub(super) whereabouts: Option<whereabouts::Feed>,
    /// The other nodes' NodeQuarantine objects as last read, when the agent publishes.
    pub(super) cluster: Option<crate::publish::cluster::ClusterReader>,
}

impl Publishing {
    /// Hands the addresses of `registry` changed since the last call to the publisher and the
    /// projection, as one batch. When either feed is full they stay in the registry's set of
    /// changed addresses (coalesced: an address changed again is still one) for the next call.
    fn send_changes(&self, registry: &mut Registry) {
        let Some(feed) = &self.publish else { return };
        if !registry.changes().has_published_changes() {
            return;
        }
        // Both ends take the same batch: the changes leave the registry only when each has
        // room for it, and otherwise wait there, coalesced, for the next call.
        let projection = self.whereabouts.as_ref();
        if projection.is_some_and(|p| !p.has_room()) {
            return;
        }
        feed.send_with(|| {
            let changed = registry.changes_mut().take_published_changed();
            if let Some(projection) = projection {
                projection.send_batch(
                    changed
                        .iter()
                        .map(|&addr| whereabouts::Change {
                            addr,
                            want: registry.records().get(addr).and_then(whereabouts::Want::of),
                        })
                        .collect(),
                );
            }
            changed
                .into_iter()
                .map(|addr| Change {
                    addr,
                    entry: registry.records().get(addr).and_then(PublishedEntry::of),
                })
                .collect()
        });
    }
}

impl Publishing {
    /// From now on `registry`'s changes go to `feed` (and to `projection`, whereabouts'),
    /// starting with every address it holds; their writers start once those are all sent, so
    /// that their first write is the whole state.
    pub(super) fn start(
        &mut self,
        registry: &mut Registry,
        feed: Feed,
        projection: Option<whereabouts::Feed>,
        cluster: Option<crate::publish::cluster::ClusterReader>,
    ) {
        registry.track_published_changes();
        *self = Publishing {
            publish: Some(feed),
            whereabouts: projection,
            cluster,
        };
        self.send_changes(registry);
        if let Some(feed) = &mut self.publish {
            feed.launch();
        }
        if let Some(projection) = &mut self.whereabouts {
            projection.launch();
        }
    }
}

impl Tracker {
    /// Hands the addresses changed since the last call to the publisher (the agent's loop
    /// calls it after every input it handled, and at least once a second).
    pub fn publish_changes(&mut self) {
        self.publishing.send_changes(&mut self.core.registry);
    }
}
