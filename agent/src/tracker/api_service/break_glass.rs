//! Break-glass requests (`PUT|DELETE /v1/datapath/{ip}`) as the API sees them: the entry a
//! request asks for, checked before the owner writes it, and the answer's view of the entry
//! written or removed.

use std::net::IpAddr;

use ipq_api::EntryState;
use ipq_common::addr::{AddrEntry, AddrState, NO_IFINDEX};

use crate::{
    api::{
        model::{DatapathEntryRequest, DatapathEntryView, ErrorCode},
        views::ApiError,
    },
    datapath::DatapathError,
    netdev,
};

/// The entry `request` asks to write, stamped now; refused for `free` (a name the request's
/// type knows but no entry has), an unknown interface, or a held state without a holder.
pub fn datapath_entry(request: &DatapathEntryRequest) -> Result<AddrEntry, ApiError> {
    let state = request.state.entry().ok_or_else(|| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            format!(
                "state \"{}\": give active, draining or quarantined",
                request.state
            ),
        )
    })?;
    let holder = ifindex(request.holder.as_deref(), "holder")?;
    let fenced = ifindex(request.fenced.as_deref(), "fenced")?;
    if state != AddrState::Quarantined && holder == NO_IFINDEX {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("holder: required for an {} address", state.as_ref()),
        ));
    }
    Ok(AddrEntry::new(state, holder, netdev::monotonic_ns()).with_fenced(fenced))
}

/// The answer to a break-glass write or removal: the entry written, or the one removed
/// (`None`: there was none to remove).
pub fn datapath_view(
    addr: IpAddr,
    result: Result<Option<AddrEntry>, DatapathError>,
) -> Result<DatapathEntryView, ApiError> {
    let entry = result
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("{addr}: {e}")))?
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("{addr} is not in the datapath"),
            )
        })?;
    Ok(DatapathEntryView {
        address: addr,
        state: EntryState::of_raw(entry.state()),
        holder_ifindex: entry.holder_ifindex,
        fenced_ifindex: entry.fenced_ifindex,
    })
}

fn ifindex(name: Option<&str>, what: &str) -> Result<u32, ApiError> {
    match name {
        None => Ok(NO_IFINDEX),
        Some(name) => netdev::ifindex(name).ok_or_else(|| {
            ApiError::new(
                ErrorCode::UnknownInterface,
                format!("{what} interface {name:?} does not exist on this node"),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(json: &str) -> Result<DatapathEntryRequest, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// The state is read as the API's state name: an unknown one fails the body naming the
    /// names it may be, `free` (a name with no entry) is refused naming the input, and a held
    /// state needs its holder but for `quarantined`.
    #[test]
    fn a_break_glass_state_is_a_held_state_name() {
        let unknown = request(r#"{"state": "fenced"}"#).unwrap_err().to_string();
        assert!(
            unknown.contains("fenced") && unknown.contains("quarantined"),
            "{unknown}"
        );
        let free = datapath_entry(&request(r#"{"state": "free"}"#).unwrap()).unwrap_err();
        assert_eq!(free.0.code, ErrorCode::InvalidArgument);
        assert!(free.0.message.contains("\"free\""), "{}", free.0.message);
        let held = datapath_entry(&request(r#"{"state": "active"}"#).unwrap()).unwrap_err();
        assert!(held.0.message.contains("holder"), "{}", held.0.message);
        let entry = datapath_entry(&request(r#"{"state": "quarantined"}"#).unwrap()).unwrap();
        assert_eq!(entry.state(), Some(AddrState::Quarantined));
        assert_eq!(entry.holder_ifindex, NO_IFINDEX);
    }
}
