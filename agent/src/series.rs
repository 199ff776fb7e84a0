//! The one helper every owner of Prometheus series uses to create them in the agent's registry
//! (the metrics module, and reuse hygiene's own counters, which need nothing else of it).

use prometheus::{core::Collector, Registry};

/// Registers `metric` in `registry` and hands it back.
pub fn registered<M: Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> Result<M, prometheus::Error> {
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}
