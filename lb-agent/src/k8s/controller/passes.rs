//! What the controller's loop carries from one pass to the next, and the watches' stores.

use k8s_openapi::api::core::v1::{Node, Service};
use kube::runtime::reflector::Store;
use tracing::{info, warn};

use super::{GroupAddresses, Ready, try_lead};
use crate::{
    config::Config,
    k8s::{
        binding::Refusal,
        changes::{Pending, SliceIndex},
        crd::LoadBalancerGroup,
        lease::LeaseLock,
        slice::Slice,
        source::Translator,
        status,
        writer::StatusWriter,
    },
};

/// The watches' stores.
pub(super) struct Stores {
    pub(super) groups: Store<LoadBalancerGroup>,
    pub(super) services: Store<Service>,
    pub(super) slices: Store<Slice>,
    pub(super) nodes: Store<Node>,
}

impl Stores {
    /// Whether every watch has listed once.
    pub(super) fn ready(&self) -> bool {
        self.groups.is_ready() && self.services.is_ready() && self.slices.is_ready() && self.nodes.is_ready()
    }
}

/// What one pass of the loop leaves to the next.
pub(super) struct Passes {
    pub(super) leading: bool,
    /// The Service conditions written while leading (see status::keep_written_times).
    pub(super) written: status::Written,
    /// The last config handed to the agent.
    pub(super) last: Option<Config>,
    /// The translation's refusals, each reported when it appears.
    pub(super) refusals: Vec<Refusal>,
    /// The group addresses last patched onto this node, until the watch shows them.
    pub(super) published: Option<GroupAddresses>,
    /// The Services the translation left out.
    pub(super) unserved: Vec<Refusal>,
    pub(super) translator: Translator,
    pub(super) index: SliceIndex,
    /// Changes since the last pass. Until a pass succeeds, and after one fails, the next one
    /// translates everything.
    pub(super) pending: Pending,
    /// Whether the leader's status may have changed since it was last planned.
    pub(super) status_due: bool,
}

impl Default for Passes {
    fn default() -> Self {
        Passes {
            leading: false,
            written: status::Written::new(),
            last: None,
            refusals: Vec::new(),
            published: None,
            unserved: Vec::new(),
            translator: Translator::default(),
            index: SliceIndex::default(),
            pending: Pending { all: true, ..Pending::default() },
            status_due: true,
        }
    }
}

impl Passes {
    /// A stop began: a leader releases its Lease, so the next leader need not wait it out.
    pub(super) async fn stop(&self, lease: &LeaseLock) {
        if self.leading {
            match lease.release().await {
                Ok(()) => info!("stopping: leader Lease released"),
                Err(e) => warn!(error = %e, "releasing the leader Lease failed; it expires instead"),
            }
        }
    }

    /// The leader tick: the Lease taken or renewed, and the status due again.
    pub(super) async fn renew(
        &mut self,
        lease: &LeaseLock,
        writer: &mut StatusWriter,
        unanswered: &mut Option<std::time::Instant>,
    ) {
        self.status_due = true;
        let was = self.leading;
        self.leading = try_lead(lease, writer, unanswered).await;
        if self.leading != was {
            info!(leading = self.leading, "leader Lease");
            // Another leader may have written since.
            self.written.clear();
        }
    }
}
