//! The live holders of a contested address other than its holder: the fenced holder, the
//! blocked claimant and the displaced holders. Nearly every address has none, so they live in
//! one box that exists only while one of them does.

use super::types::Holder;

/// Who else lives on an address: `None` when no holder is fenced, blocked or displaced; never
/// `Some` of an empty box, so that equality does not depend on the path a record took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Contest(Option<Box<Contestants>>);

/// The holders themselves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Contestants {
    /// A live holder whose traffic with this address is dropped both ways: the old holder under
    /// `fence-old`, or a Draining holder another machine claims the address from.
    pub(super) fenced: Option<Holder>,
    /// Under `refuse-new`: a claimant seen only on netlink, fenced until the live holder is gone
    /// (or the quarantine is over), then promoted to Active holder without any action.
    pub(super) blocked_claimant: Option<Holder>,
    /// Earlier holders displaced while `fenced` was already taken (three or more claimants on
    /// one address). The datapath has one fence slot, so these rely on the duplicate-source
    /// check for what they send; the registry keeps them so that the address does not fall
    /// Free while one of them still lives (see [`Lifecycle::tick`](super::Lifecycle::tick)),
    /// and moves the first of them into `fenced` whenever that slot empties.
    pub(super) displaced: Vec<Holder>,
}

impl Contestants {
    fn is_empty(&self) -> bool {
        self.fenced.is_none() && self.blocked_claimant.is_none() && self.displaced.is_empty()
    }
}

impl Contest {
    /// The contest of `holders`; no box when there are none (nearly every record read from a
    /// journal has none: nothing to allocate and free for them on a load).
    pub(super) fn of(holders: Contestants) -> Self {
        Self((!holders.is_empty()).then(|| Box::new(holders)))
    }

    /// The fenced holder: a live holder whose traffic with this address is dropped both ways
    /// (the old holder under `fence-old`, or a Draining holder another machine claims the
    /// address from).
    pub fn fenced(&self) -> Option<&Holder> {
        self.0.as_ref()?.fenced.as_ref()
    }

    /// Under `refuse-new`: a claimant seen only on netlink, fenced until the live holder is
    /// gone (or the quarantine is over), then promoted to Active holder without any action.
    pub fn blocked_claimant(&self) -> Option<&Holder> {
        self.0.as_ref()?.blocked_claimant.as_ref()
    }

    /// Earlier holders displaced while the fence slot was already taken (three or more
    /// claimants on one address): kept so that the address does not fall Free while one of
    /// them still lives; the first moves into the fence slot whenever it empties.
    pub fn displaced(&self) -> &[Holder] {
        self.0.as_ref().map_or(&[], |c| &c.displaced)
    }

    /// Whether `holder` is the fenced holder, the blocked claimant or a displaced holder.
    pub fn is_fenced(&self, holder: &Holder) -> bool {
        self.fenced().is_some_and(|f| f.same_as(holder))
            || self.blocked_claimant().is_some_and(|b| b.same_as(holder))
            || self.displaced().iter().any(|d| d.same_as(holder))
    }

    pub(crate) fn set_fenced(&mut self, holder: Option<Holder>) {
        if holder.is_some() || self.0.is_some() {
            self.edit(|c| c.fenced = holder);
        }
    }

    /// The fenced holder, to edit in place (its identity; not who it is).
    pub(crate) fn fenced_mut(&mut self) -> Option<&mut Holder> {
        self.0.as_mut()?.fenced.as_mut()
    }

    /// The blocked claimant becomes `holder`; returns the earlier one.
    pub(crate) fn replace_blocked_claimant(&mut self, holder: Holder) -> Option<Holder> {
        self.edit(|c| c.blocked_claimant.replace(holder))
    }

    pub(crate) fn take_blocked_claimant(&mut self) -> Option<Holder> {
        self.0.as_ref()?;
        self.edit(|c| c.blocked_claimant.take())
    }

    /// Puts `holder` in the fence slot; whoever held it, if still someone other than `current`
    /// (the address's live holder), is displaced.
    pub(crate) fn fence(&mut self, holder: Holder, current: Option<&Holder>) {
        if let Some(previous) = self.edit(|c| c.fenced.replace(holder)) {
            self.displace(previous, current);
        }
    }

    /// Records a live holder that lost the address and the fence slot, unless it is `current`
    /// (the address's live holder) or already named here.
    pub(crate) fn displace(&mut self, holder: Holder, current: Option<&Holder>) {
        let known = current.is_some_and(|h| h.same_as(&holder)) || self.is_fenced(&holder);
        if !known {
            self.edit(|c| c.displaced.push(holder));
        }
    }

    /// Forgets `holder` wherever it is fenced (it becomes the holder, or is refused).
    pub(crate) fn unfence(&mut self, holder: &Holder) {
        if self.0.is_none() {
            return;
        }
        self.edit(|c| {
            if c.fenced.as_ref().is_some_and(|f| f.same_as(holder)) {
                c.fenced = None;
            }
            if c.blocked_claimant
                .as_ref()
                .is_some_and(|b| b.same_as(holder))
            {
                c.blocked_claimant = None;
            }
            c.displaced.retain(|d| !d.same_as(holder));
        });
    }

    /// Forgets interface `ifindex` wherever it is fenced, blocked or displaced (it is gone).
    pub(crate) fn forget(&mut self, ifindex: u32) {
        if self.0.is_none() {
            return;
        }
        self.edit(|c| {
            if c.fenced.as_ref().is_some_and(|f| f.ifindex == ifindex) {
                c.fenced = None;
            }
            if c.blocked_claimant
                .as_ref()
                .is_some_and(|b| b.ifindex == ifindex)
            {
                c.blocked_claimant = None;
            }
            c.displaced.retain(|d| d.ifindex != ifindex);
        });
    }

    /// The fence slot never stays empty while a displaced holder lives: the first moves in.
    pub(crate) fn refill_fence_slot(&mut self) {
        if let Some(c) = self.0.as_mut() {
            if c.fenced.is_none() && !c.displaced.is_empty() {
                c.fenced = Some(c.displaced.remove(0));
            }
        }
    }

    /// Changes the holders through `edit`, keeping the box only while it holds someone.
    /// (Callers that may change nothing check first, so that no box is made and dropped for
    /// nothing.)
    fn edit<T>(&mut self, edit: impl FnOnce(&mut Contestants) -> T) -> T {
        let contest = self.0.get_or_insert_with(Box::default);
        let result = edit(contest);
        if contest.is_empty() {
            self.0 = None;
        }
        result
    }
}
