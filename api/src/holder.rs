//! Who holds an address: the host-side interface, plus whatever identity a CNI or API claim
//! gave.
//!
//! A registry keeps up to one holder per address in every record (tens of thousands of them),
//! and most are known only by their interface (netlink observations). The identity fields are
//! therefore kept out of line, in one box that exists only when one of them is known: a bare
//! holder is 40 bytes instead of 200. Its JSON (journal, API) is the flat object it always was.

use std::fmt;

use serde::{Deserialize, Serialize, Serializer};

/// The Kubernetes pod a holder belongs to, as CNI args name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID`; runtimes older than CNI args v1 do not pass it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// What uses an address on this node: the host side interface plus whatever identity is known.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(from = "HolderWire")]
pub struct Holder {
    pub ifindex: u32,
    pub ifname: String,
    /// `None` when no identity field is known; never `Some` of an empty identity, so that
    /// equality does not depend on how a holder was built.
    identity: Option<Box<Identity>>,
}

/// The identity beyond the interface (a CNI attachment, an API claim's names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Identity {
    container_id: Option<String>,
    /// The container-side interface (`CNI_IFNAME`): with the container id, a CNI attachment.
    cni_ifname: Option<String>,
    /// The CNI network (conflist `name`) of that attachment.
    network: Option<String>,
    netns: Option<String>,
    pod: Option<PodRef>,
}

impl Identity {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A holder as JSON has it: one flat object. (Spelled out rather than `flatten`ed: a flattened
/// field makes serde buffer every object, and a journal holds one holder per address.)
#[derive(Deserialize)]
struct HolderWire {
    ifindex: u32,
    ifname: String,
    #[serde(default)]
    container_id: Option<String>,
    #[serde(default)]
    cni_ifname: Option<String>,
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    netns: Option<String>,
    #[serde(default)]
    pod: Option<PodRef>,
}

impl From<HolderWire> for Holder {
    fn from(wire: HolderWire) -> Self {
        Holder::new(wire.ifindex, wire.ifname).with_identity(
            wire.container_id,
            wire.cni_ifname,
            wire.network,
            wire.netns,
            wire.pod,
        )
    }
}

/// The same flat object, borrowed: serializing a holder copies nothing.
#[derive(Serialize)]
struct HolderRef<'a> {
    ifindex: u32,
    ifname: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cni_ifname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    netns: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod: Option<&'a PodRef>,
}

impl Serialize for Holder {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        HolderRef {
            ifindex: self.ifindex,
            ifname: &self.ifname,
            container_id: self.container_id(),
            cni_ifname: self.cni_ifname(),
            network: self.network(),
            netns: self.netns(),
            pod: self.pod(),
        }
        .serialize(serializer)
    }
}

impl Holder {
    /// A holder known only by its interface.
    pub fn new(ifindex: u32, ifname: impl Into<String>) -> Self {
        Self {
            ifindex,
            ifname: ifname.into(),
            identity: None,
        }
    }

    pub fn container_id(&self) -> Option<&str> {
        self.identity.as_ref()?.container_id.as_deref()
    }

    pub fn cni_ifname(&self) -> Option<&str> {
        self.identity.as_ref()?.cni_ifname.as_deref()
    }

    pub fn network(&self) -> Option<&str> {
        self.identity.as_ref()?.network.as_deref()
    }

    pub fn netns(&self) -> Option<&str> {
        self.identity.as_ref()?.netns.as_deref()
    }

    pub fn pod(&self) -> Option<&PodRef> {
        self.identity.as_ref()?.pod.as_ref()
    }

    pub fn with_container_id(mut self, id: impl Into<String>) -> Self {
        self.identity_mut().container_id = Some(id.into());
        self
    }

    pub fn with_cni_ifname(mut self, ifname: impl Into<String>) -> Self {
        self.identity_mut().cni_ifname = Some(ifname.into());
        self
    }

    pub fn with_network(mut self, network: impl Into<String>) -> Self {
        self.identity_mut().network = Some(network.into());
        self
    }

    pub fn with_netns(mut self, netns: impl Into<String>) -> Self {
        self.identity_mut().netns = Some(netns.into());
        self
    }

    pub fn with_pod(mut self, pod: PodRef) -> Self {
        self.identity_mut().pod = Some(pod);
        self
    }

    /// The identity fields at once, each optional (an API claim's holder spec).
    pub fn with_identity(
        mut self,
        container_id: Option<String>,
        cni_ifname: Option<String>,
        network: Option<String>,
        netns: Option<String>,
        pod: Option<PodRef>,
    ) -> Self {
        let identity = Identity {
            container_id,
            cni_ifname,
            network,
            netns,
            pod,
        };
        self.identity = (!identity.is_empty()).then(|| Box::new(identity));
        self
    }

    fn identity_mut(&mut self) -> &mut Identity {
        self.identity.get_or_insert_with(Box::default)
    }

    /// Two holders are the same iff they have the same interface and, when both carry a
    /// container id, the same container id. (A netlink-only observation knows no container.)
    pub fn same_as(&self, other: &Holder) -> bool {
        self.ifindex == other.ifindex
            && match (self.container_id(), other.container_id()) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }

    /// Fills identity fields this holder lacks from `other` (the same holder seen by a richer
    /// source). Never overwrites what is known. Returns whether anything changed.
    pub fn merge_identity(&mut self, other: &Holder) -> bool {
        let mut changed = false;
        if self.ifname.is_empty() && !other.ifname.is_empty() {
            self.ifname.clone_from(&other.ifname);
            changed = true;
        }
        let Some(theirs) = other.identity.as_deref() else {
            return changed;
        };
        let mine = self.identity_mut();
        changed |= fill(&mut mine.container_id, &theirs.container_id);
        changed |= fill(&mut mine.cni_ifname, &theirs.cni_ifname);
        changed |= fill(&mut mine.network, &theirs.network);
        changed |= fill(&mut mine.netns, &theirs.netns);
        changed |= fill(&mut mine.pod, &theirs.pod);
        if mine.is_empty() {
            self.identity = None;
        }
        changed
    }
}

fn fill<T: Clone>(slot: &mut Option<T>, from: &Option<T>) -> bool {
    if slot.is_none() && from.is_some() {
        slot.clone_from(from);
        true
    } else {
        false
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (ifindex {})", self.ifname, self.ifindex)?;
        if let Some(pod) = self.pod() {
            write!(f, " pod {}/{}", pod.namespace, pod.name)?;
        }
        if let Some(id) = self.container_id() {
            write!(f, " container {}", id.get(..12).unwrap_or(id))?;
        }
        Ok(())
    }
}
