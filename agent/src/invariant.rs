//! What the self-checks of the agent's indexed structures report (tests and property tests call
//! them after every step): an index that no longer lists what its entries say.

use std::fmt::Debug;

use thiserror::Error;

/// An index as kept beside the one rebuilt from the entries, both shown as found: a failing
/// property test prints them.
#[derive(Debug, Error)]
#[error("{index} {kept} != {rebuilt}")]
pub struct InvariantViolation {
    pub index: &'static str,
    pub kept: String,
    pub rebuilt: String,
}

/// Whether the index `kept` (named `index`) equals the one `rebuilt` from the entries.
pub fn same_index<T: PartialEq + Debug>(
    index: &'static str,
    kept: &T,
    rebuilt: &T,
) -> Result<(), InvariantViolation> {
    if kept == rebuilt {
        return Ok(());
    }
    Err(InvariantViolation {
        index,
        kept: format!("{kept:?}"),
        rebuilt: format!("{rebuilt:?}"),
    })
}
