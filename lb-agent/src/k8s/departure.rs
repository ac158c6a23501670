//! Why this agent's pod is stopping, asked once at SIGTERM: replaced by its DaemonSet's newer
//! revision (a roll), or removed. A roll leaves the routed VIPs for the next agent on the node
//! (graceful restart at the ToR keeps them while the pod is replaced); a removal withdraws them
//! and drains, as a stop always did. Anything unclear is a removal, the choice that can never
//! leave routes behind a node that is going away.
//!
//! The DaemonSet controller deletes an outdated pod through the API before the kubelet stops
//! it, so the pod has a `deletionTimestamp` and an older `controller-revision-hash` than its
//! DaemonSet's newest ControllerRevision. A node's shutdown, a container restart or an eviction
//! leaves the pod undeleted (the kubelet stops it on its own) or on the current revision.

use k8s_openapi::api::{apps::v1::ControllerRevision, core::v1::Pod};
use kube::{Api, Client, api::ListParams};

/// The label the DaemonSet controller puts on its pods and revisions.
const REVISION_HASH: &str = "controller-revision-hash";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Departure {
    /// Replaced by the DaemonSet's newer revision: leave the routes to the next agent.
    Replacement,
    /// Anything else, and why.
    Removal(String),
}

/// The pure decision from this agent's pod and the revisions in its namespace.
pub fn departure(pod: &Pod, revisions: &[ControllerRevision]) -> Departure {
    let removal = |why: &str| Departure::Removal(why.to_owned());
    if pod.metadata.deletion_timestamp.is_none() {
        return removal("the pod is not being deleted (a container restart, or the node shutting down)");
    }
    let Some(owner) = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true))
    else {
        return removal("the pod has no DaemonSet as its controller");
    };
    let Some(running) = revision_hash(&pod.metadata) else {
        return removal("the pod has no controller-revision-hash label");
    };
    let newest = revisions
        .iter()
        .filter(|r| r.metadata.owner_references.iter().flatten().any(|o| o.uid == owner.uid))
        .max_by_key(|r| r.revision);
    let Some(newest) = newest.and_then(|r| revision_hash(&r.metadata)) else {
        return removal("no ControllerRevision of the pod's DaemonSet was found");
    };
    if newest == running {
        return removal("the pod runs its DaemonSet's newest revision: it is removed, not replaced");
    }
    Departure::Replacement
}

fn revision_hash(meta: &kube::api::ObjectMeta) -> Option<&str> {
    meta.labels.as_ref()?.get(REVISION_HASH).map(String::as_str)
}

/// Reads this agent's pod and its namespace's ControllerRevisions, and decides.
pub async fn check(client: Client, namespace: &str, pod_name: &str) -> Result<Departure, kube::Error> {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace).get(pod_name).await?;
    let revisions =
        Api::<ControllerRevision>::namespaced(client, namespace).list(&ListParams::default()).await?;
    Ok(departure(&pod, &revisions.items))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DS_UID: &str = "ds-1";

    fn pod(deleting: bool, hash: Option<&str>, owner_kind: &str) -> Pod {
        let mut labels = json!({"app.kubernetes.io/name": "lb-agent"});
        if let Some(hash) = hash {
            labels[REVISION_HASH] = json!(hash);
        }
        let mut pod = json!({"metadata": {"name": "lb-agent-x", "labels": labels, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": owner_kind, "name": "lb-agent", "uid": DS_UID, "controller": true}]}});
        if deleting {
            pod["metadata"]["deletionTimestamp"] = json!("2026-11-28T05:00:00Z");
        }
        serde_json::from_value(pod).unwrap()
    }

    fn revision(hash: &str, number: i64, owner: &str) -> ControllerRevision {
        serde_json::from_value(json!({"metadata": {"name": format!("lb-agent-{hash}"), "labels": {REVISION_HASH: hash},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "lb-agent", "uid": owner, "controller": true}]},
            "revision": number}))
        .unwrap()
    }

    #[test]
    fn only_a_deleted_pod_of_an_older_revision_is_being_replaced() {
        let revisions =
            [revision("old", 1, DS_UID), revision("new", 2, DS_UID), revision("other", 9, "ds-2")];
        // (pod, revisions, replaced?)
        let cases: [(Pod, &[ControllerRevision], bool); 7] = [
            (pod(true, Some("old"), "DaemonSet"), &revisions, true),
            // The newest revision of its own DaemonSet is what counts, not another's.
            (pod(true, Some("new"), "DaemonSet"), &revisions, false),
            // Not deleted: the kubelet stops it on its own (a node shutdown, a restart).
            (pod(false, Some("old"), "DaemonSet"), &revisions, false),
            (pod(true, None, "DaemonSet"), &revisions, false),
            (pod(true, Some("old"), "ReplicaSet"), &revisions, false),
            (pod(true, Some("old"), "DaemonSet"), &[], false),
            (pod(true, Some("old"), "DaemonSet"), &revisions[2..], false),
        ];
        for (i, (pod, revisions, replaced)) in cases.into_iter().enumerate() {
            let decided = departure(&pod, revisions);
            assert_eq!(decided == Departure::Replacement, replaced, "case {i}: {decided:?}");
        }
    }
}
