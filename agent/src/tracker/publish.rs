//! What changed in the registry, handed to the NodeQuarantine publisher (`crate::publish`)
//! and, when enabled, to its projection into whereabouts' reservations: each changed address's
//! entry as it is now, O(1) per address; they do the rest off this loop.

use super::Tracker;
use crate::publish::{whereabouts, Change, Feed, PublishedEntry};

impl Tracker {
    /// From now on the registry's changes go to `feed`, starting with every address it holds;
    /// its writer starts once those are all sent, so that its first write is the whole state.
    pub fn start_publishing(&mut self, feed: Feed) {
        self.core.registry.track_published_changes();
        self.publish = Some(feed);
        self.publish_changes();
        if let Some(feed) = &mut self.publish {
            feed.launch();
        }
        if let Some(projection) = &mut self.whereabouts {
            projection.launch();
        }
    }

    /// The whereabouts projection gets what the publisher gets; called before
    /// [`Tracker::start_publishing`], so that it starts from the whole state too.
    pub fn start_projecting(&mut self, feed: crate::publish::whereabouts::Feed) {
        self.whereabouts = Some(feed);
    }

    /// Hands the addresses changed since the last call to the publisher, as one batch (the
    /// agent's loop calls it after every event it handled, and at least once a second). When
    /// the publisher's feed is full they stay in the registry's set of changed addresses
    /// (coalesced: an address changed again is still one) for the next call.
    pub fn publish_changes(&mut self) {
        let Some(feed) = &self.publish else { return };
        let registry = &mut self.core.registry;
        if !registry.has_published_changes() {
            return;
        }
        // Both ends take the same batch: the changes leave the registry only when each has
        // room for it, and otherwise wait there, coalesced, for the next call.
        let projection = self.whereabouts.as_ref();
        if projection.is_some_and(|p| !p.has_room()) {
            return;
        }
        feed.send_with(|| {
            let changed = registry.take_published_changed();
            if let Some(projection) = projection {
                projection.send_batch(
                    changed
                        .iter()
                        .map(|&addr| whereabouts::Change {
                            addr,
                            want: registry.get(addr).and_then(whereabouts::Want::of),
                        })
                        .collect(),
                );
            }
            changed
                .into_iter()
                .map(|addr| Change {
                    addr,
                    entry: registry.get(addr).and_then(PublishedEntry::of),
                })
                .collect()
        });
    }
}
