//! Why ipq's program could not be put on a hook. The kernel's errno is kept beside the text of
//! every error under it, so that what to do next (an interface gone is churn, not a failure to
//! retry loudly) is decided on the errno, not on a message.

use std::io;

use ipq_common::names::{TC_FILTER_HANDLE, TC_FILTER_PRIORITY};

/// Why ipq's program is not on a hook.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AttachError {
    /// A call into the kernel failed (through aya, the bpf syscall or rtnetlink).
    #[error("{}{message}", doing.as_deref().map(|d| format!("{d}: ")).unwrap_or_default())]
    Kernel {
        /// What ipq was doing, when the error does not say it.
        doing: Option<String>,
        /// The OS error found under the error, if any.
        errno: Option<i32>,
        /// The error and every error under it.
        message: String,
    },
    /// Another tool's filter holds ipq's priority and handle on a clsact hook.
    #[error(
        "a foreign {filter} holds ipq's place on the {direction} hook (pref \
         {TC_FILTER_PRIORITY} handle {TC_FILTER_HANDLE:#x}); ipq does not touch filters it does \
         not own: move that filter to another priority"
    )]
    ForeignFilter {
        filter: String,
        direction: &'static str,
    },
    /// Another qdisc than clsact holds the device's ingress place (`tc qdisc add ... ingress`
    /// after a clsact was deleted). The kernel would take both of ipq's filters into that
    /// qdisc's one block, so the egress hook would be reported attached and never run.
    #[error(
        "a foreign `{kind}` qdisc holds the clsact qdisc's place (ffff:); ipq's filters need \
         clsact's two hooks and ipq does not delete qdiscs it does not own: delete it (`tc \
         qdisc del dev <dev> {kind}`)"
    )]
    ForeignQdisc { kind: String },
    /// Protect-first could attach neither the netlink filter nor the TCX link.
    #[error("{netlink}; and as TCX: {tcx}")]
    NeitherWay {
        netlink: Box<AttachError>,
        tcx: Box<AttachError>,
    },
}

impl AttachError {
    /// `e` and every error under it, with the first OS error found among them.
    pub fn kernel(doing: Option<String>, e: &(dyn std::error::Error + 'static)) -> Self {
        Self::Kernel {
            doing,
            errno: errno_of(e),
            message: chain(e),
        }
    }

    /// An I/O error while doing `doing`.
    pub fn io(doing: impl Into<String>, e: &io::Error) -> Self {
        Self::Kernel {
            doing: Some(doing.into()),
            errno: e.raw_os_error(),
            message: e.to_string(),
        }
    }

    /// The OS error under this one (for [`AttachError::NeitherWay`], the TCX attempt's).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { errno, .. } => *errno,
            Self::ForeignFilter { .. } | Self::ForeignQdisc { .. } => None,
            Self::NeitherWay { tcx, netlink } => tcx.errno().or_else(|| netlink.errno()),
        }
    }

    /// Whether the kernel said the interface does not exist (any more): churn, not a failure.
    pub fn interface_gone(&self) -> bool {
        matches!(self.errno(), Some(libc::ENODEV | libc::ENXIO))
    }
}

/// `e` and every error under it: aya's errors keep the OS error (EMFILE...) in their source.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let more = inner.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = inner.source();
    }
    text
}

/// The first OS error in `e`'s chain.
fn errno_of(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(code) = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(code);
        }
        current = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("attaching the program")]
    struct Outer(#[source] io::Error);

    #[test]
    fn the_errno_under_an_error_is_kept_beside_its_whole_text() {
        let e = AttachError::kernel(None, &Outer(io::Error::from_raw_os_error(libc::EMFILE)));
        assert_eq!(e.errno(), Some(libc::EMFILE));
        let text = e.to_string();
        assert!(text.starts_with("attaching the program: "), "{text}");
        assert!(text.contains("os error 24"), "{text}");
        let gone = AttachError::io(
            "adding the clsact qdisc",
            &io::Error::from_raw_os_error(libc::ENODEV),
        );
        assert!(gone.interface_gone());
        assert!(
            gone.to_string().starts_with("adding the clsact qdisc: "),
            "{gone}"
        );
        let both = AttachError::NeitherWay {
            netlink: Box::new(AttachError::ForeignFilter {
                filter: "u32 filter".into(),
                direction: "ingress",
            }),
            tcx: Box::new(gone),
        };
        assert!(both.interface_gone());
        assert!(both.to_string().contains("u32 filter") && both.to_string().contains("as TCX"));
    }
}
