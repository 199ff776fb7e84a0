//! ipq-ipam's routes that need no owner loop: its allocation records are a table of their own.

use ipq_api::model::AllocationRecord;

use super::{
    super::{model::ErrorCode, views::ApiError},
    Context,
};
use crate::ipam::records::RecordError;

/// Keeps ipq-ipam's record of an allocation its ADD made (issue 27): what a release of it will
/// run. On a blocking thread: one file write and fsync. A full table refuses it (507,
/// ipq-ipam's ADD fails with code 11) and counts.
pub(super) async fn record_allocation(
    ctx: &Context,
    record: AllocationRecord,
) -> Result<AllocationRecord, ApiError> {
    let records = ctx.ipam_records.clone();
    let kept = record.clone();
    let stored = tokio::task::spawn_blocking(move || records.insert(record))
        .await
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("recording: {e}")))?;
    match stored {
        Ok(()) => {
            log::debug!(
                "ipam: recorded the allocation of container {} ({}) by {}",
                kept.container_id,
                kept.ifname,
                kept.delegate_type
            );
            Ok(kept)
        }
        Err(e @ RecordError::Full { .. }) => {
            ctx.metrics.ipam.records_full.inc();
            Err(ApiError::new(ErrorCode::RegistryFull, e.to_string()))
        }
        Err(e) => Err(ApiError::new(ErrorCode::Internal, e.to_string())),
    }
}
