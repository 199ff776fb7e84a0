//! What changed in the registry, handed to the NodeQuarantine publisher (`crate::publish`):
//! each changed address's entry as it is now, O(1) per address; the publisher does the rest
//! off this loop.

use super::Tracker;
use crate::publish::{Change, Feed, PublishedEntry};

impl Tracker {
    /// From now on the registry's changes go to `feed`, starting with every address it holds;
    /// its writer starts once those are all sent, so that its first write is the whole state.
    pub fn start_publishing(&mut self, feed: Feed) {
        self.registry.track_published_changes();
        self.publish = Some(feed);
        self.publish_changes();
        if let Some(feed) = &mut self.publish {
            feed.launch();
        }
    }

    /// Hands the addresses changed since the last call to the publisher, as one batch (the
    /// agent's loop calls it after every event it handled, and at least once a second). When
    /// the publisher's feed is full they stay in the registry's set of changed addresses
    /// (coalesced: an address changed again is still one) for the next call.
    pub fn publish_changes(&mut self) {
        let Some(feed) = &self.publish else { return };
        let registry = &mut self.registry;
        if !registry.has_published_changes() {
            return;
        }
        feed.send_with(|| {
            registry
                .take_published_changed()
                .into_iter()
                .map(|addr| Change {
                    addr,
                    entry: registry.get(addr).and_then(PublishedEntry::of),
                })
                .collect()
        });
    }
}
