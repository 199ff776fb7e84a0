//! What the registry takes from the configuration: the policy and the quarantine's bounds, and
//! when a quarantine ends given its stale traffic.

use std::time::Duration;

use super::types::{duration_ns, MonoNs};
use crate::config::{Config, EarlyReusePolicy};

/// The registry's knobs, taken from the agent configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegistrySettings {
    pub policy: EarlyReusePolicy,
    pub cooldown: Duration,
    pub quiet_period: Duration,
    pub max_cooldown: Duration,
    pub capacity: u32,
}

impl From<&Config> for RegistrySettings {
    fn from(config: &Config) -> Self {
        Self {
            policy: config.on_early_reuse,
            cooldown: config.cooldown,
            quiet_period: config.quiet_period,
            max_cooldown: config.max_cooldown,
            capacity: config.capacity,
        }
    }
}

impl Default for RegistrySettings {
    fn default() -> Self {
        Self::from(&Config::default())
    }
}

impl RegistrySettings {
    /// When a quarantine that began at `since` ends: `max(since + cooldown, last_stale +
    /// quiet_period)`, capped at `since + max_cooldown`. The cap never undercuts the cooldown,
    /// even with settings that were not validated (`max_cooldown < cooldown`).
    pub fn release_at(&self, since: MonoNs, last_stale: Option<MonoNs>) -> MonoNs {
        let cooldown = duration_ns(self.cooldown);
        let cap = since.saturating_add(duration_ns(self.max_cooldown).max(cooldown));
        let base = since.saturating_add(cooldown);
        let quiet = last_stale.map_or(0, |at| at.saturating_add(duration_ns(self.quiet_period)));
        base.max(quiet).min(cap)
    }
}
