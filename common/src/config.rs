//! The single-entry `IPQ_CONFIG` array: the agent's settings the kernel programs need.

/// Enforcement mode: the one `Mode` of ipq, from the agent's configuration through the
/// kernel's config map to the API. Stored in the map as its `u32` discriminant; the zeroed
/// array means `Enforce`, the configuration's default. On the API it is `enforce`/`observe`.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, strum::FromRepr)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "lowercase")
)]
#[cfg_attr(
    feature = "names",
    derive(
        strum::IntoStaticStr,
        strum::AsRefStr,
        strum::Display,
        strum::EnumString
    ),
    strum(serialize_all = "lowercase")
)]
#[derive(strum::VariantArray)]
pub enum Mode {
    /// Drop what conflicts.
    Enforce = 0,
    /// Drop nothing; count what would have been dropped.
    Observe = 1,
}

impl Mode {
    /// The mode of the config map's raw value. Unlike the derived `from_repr`, never `None`:
    /// anything unknown enforces, because ipq is a safety net and fails closed on its own config.
    #[inline(always)]
    pub const fn from_raw(raw: u32) -> Self {
        match Self::from_repr(raw) {
            Some(mode) => mode,
            None => Self::Enforce,
        }
    }
}

/// Default minimum interval between two conflict samples for one address.
pub const DEFAULT_SAMPLE_INTERVAL_NS: u64 = 1_000_000_000;

#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct DatapathConfig {
    /// A [`Mode`] discriminant.
    pub mode: u32,
    /// What a co-tenant probe carries (`probe::ProbeMark::cookie`); 0: no probe is counted.
    /// Written by the agent at load, random per load.
    pub probe_cookie: u32,
    /// Minimum interval between two conflict samples of one address, in nanoseconds.
    pub sample_interval_ns: u64,
}
crate::assert_layout!(DatapathConfig, size = 16, align = 8);
crate::assert_offsets!(DatapathConfig {
    mode: 0,
    probe_cookie: 4,
    sample_interval_ns: 8,
});
