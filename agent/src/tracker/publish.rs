//! What changed in the registry, handed to the NodeQuarantine publisher (`crate::publish`)
//! and, when enabled, to its projection into whereabouts' reservations: each changed address's
//! entry as it is now, O(1) per address; they do the rest off this loop.

use super::Tracker;
use crate::publish::{whereabouts::Want, Feed, PublishedEntry};

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
        if let Some(projection) = &mut self.whereabouts {
            projection.launch();
        }
    }

    /// The whereabouts projection gets what the publisher gets; called before
    /// [`Tracker::start_publishing`], so that it starts from the whole state too.
    pub fn start_projecting(&mut self, feed: crate::publish::whereabouts::Feed) {
        self.whereabouts = Some(feed);
    }

    /// Hands the addresses changed since the last call to the publisher (the agent's loop calls
    /// it after every event it handled).
    pub fn publish_changes(&mut self) {
        let Some(feed) = &self.publish else { return };
        for addr in self.registry.take_published_changed() {
            let record = self.registry.get(addr);
            if let Some(projection) = &self.whereabouts {
                projection.send(addr, record.and_then(Want::of));
            }
            feed.send(addr, record.and_then(PublishedEntry::of));
        }
    }
}
