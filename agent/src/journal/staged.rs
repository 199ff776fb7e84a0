//! The keys changed and not yet durable, and the batch line that writes them: each key's record
//! now, or its deletion. A failed commit keeps them, and the next commit writes them.

use std::collections::BTreeSet;

use super::{
    format::{frame, Line},
    invalid_data, unix_ms, Contents, Entry,
};
use crate::netdev;

pub(super) struct Staged<E: Entry> {
    keys: BTreeSet<E::Key>,
}

impl<E: Entry> Staged<E> {
    pub(super) fn new() -> Self {
        Self {
            keys: BTreeSet::new(),
        }
    }

    pub(super) fn extend(&mut self, keys: impl IntoIterator<Item = E::Key>) {
        self.keys.extend(keys);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys were written (appended to the log, or in a new file holding everything).
    pub(super) fn clear(&mut self) {
        self.keys.clear();
    }

    /// One framed line holding every staged key's record in `state`, or its deletion.
    pub(super) fn line(&self, state: &impl Contents<E>) -> std::io::Result<Vec<u8>> {
        let mut put = Vec::new();
        let mut del = Vec::new();
        for key in &self.keys {
            match state.get(key) {
                Some(record) => put.push(record),
                None => del.push(key),
            }
        }
        let json = serde_json::to_vec(&Line {
            m: Some(netdev::monotonic_ns()),
            u: Some(unix_ms()),
            put,
            del,
        })
        .map_err(invalid_data)?;
        let mut line = Vec::with_capacity(json.len() + 18);
        frame(&json, &mut line);
        Ok(line)
    }
}
