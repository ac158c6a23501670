//! The leader's writes: a thin shell that carries out a [`StatusWrites`] with server-side apply
//! (field manager `lb-agent`), so agents never overwrite each other's or a user's fields, and
//! Events through kube's Recorder (which folds repeats into a series).

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use serde_json::json;

use super::{
    crd::LoadBalancerGroup,
    status::{IPAM_FINALIZER, SERVICE_CONDITION, StatusWrites},
};

/// The field manager of everything the leader applies.
pub const FIELD_MANAGER: &str = "lb-agent";
/// The finalizer has its own manager, so applying "no finalizer" removes only ours.
pub const FINALIZER_MANAGER: &str = "lb-agent-ipam";
/// So has the Service condition, so it and the addresses are applied independently.
pub const CONDITION_MANAGER: &str = "lb-agent-conditions";

pub struct StatusWriter {
    client: Client,
    recorder: Recorder,
    /// Past this the leader Lease may have passed to another agent: a pass still writing
    /// stops (a pass of thousands of writes outlasts a renewal; two leaders must not write).
    pub lead_until: Option<std::time::Instant>,
}

impl StatusWriter {
    /// `instance` names this agent in Events (its node).
    pub fn new(client: Client, instance: String) -> Self {
        let reporter = Reporter { controller: "lb-agent".into(), instance: Some(instance) };
        Self { recorder: Recorder::new(client.clone(), reporter), client, lead_until: None }
    }

    /// Applies `writes`: finalizers first (an address is never published for a Service that
    /// could be deleted without releasing it), then addresses, Events, Service conditions,
    /// group status, and last the releases of deleted Services.
    pub async fn apply(&self, writes: &StatusWrites) -> Result<(), kube::Error> {
        for (namespace, name) in &writes.add_finalizer {
            self.still_leading()?;
            self.finalizers(namespace, name, &[IPAM_FINALIZER]).await?;
        }
        for ((namespace, name), ips) in &writes.ingress {
            self.still_leading()?;
            let ingress: Vec<_> =
                ips.iter().map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"})).collect();
            let body = json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": ingress}}});
            Api::<Service>::namespaced(self.client.clone(), namespace)
                .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(body))
                .await?;
        }
        for ((namespace, name), reason, message) in &writes.warnings {
            let regarding = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some(namespace.clone()),
                name: Some(name.clone()),
                ..Default::default()
            };
            self.warn(regarding, reason, message, "Allocate").await?;
        }
        for ((namespace, name), c) in &writes.conditions {
            self.still_leading()?;
            let condition = json!({
                "type": SERVICE_CONDITION, "status": c.status, "reason": c.reason, "message": c.message,
                "observedGeneration": c.observed_generation, "lastTransitionTime": c.last_transition_time,
            });
            let body = json!({"apiVersion": "v1", "kind": "Service", "status": {"conditions": [condition]}});
            Api::<Service>::namespaced(self.client.clone(), namespace)
                .patch_status(name, &PatchParams::apply(CONDITION_MANAGER).force(), &Patch::Apply(body))
                .await?;
        }
        for (name, status) in &writes.groups {
            self.still_leading()?;
            let body =
                json!({"apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "status": status});
            Api::<LoadBalancerGroup>::all(self.client.clone())
                .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(body))
                .await?;
        }
        for (namespace, name) in &writes.release {
            self.still_leading()?;
            if let Err(e) = self.finalizers(namespace, name, &[]).await {
                // A release can race the deletion it allowed (a second pass saw the Service
                // before its removal): the apply would then create a bare Service, which the
                // server refuses. Gone is what the release wanted.
                let gone = matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 422)
                    && Api::<Service>::namespaced(self.client.clone(), namespace)
                        .get_opt(name)
                        .await?
                        .is_none();
                if !gone {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn still_leading(&self) -> Result<(), kube::Error> {
        match self.lead_until {
            Some(until) if std::time::Instant::now() >= until => Err(kube::Error::Service(
                "stopped mid-pass: the leader Lease was last renewed too long ago to write on".into(),
            )),
            _ => Ok(()),
        }
    }

    /// A Warning Event about a LoadBalancerGroup, from this node (e.g. its interface is
    /// missing here): every agent reports its own.
    pub async fn group_warning(&self, group: &str, reason: &str, message: &str) -> Result<(), kube::Error> {
        let regarding = ObjectReference {
            api_version: Some("lb-agent.io/v1alpha1".into()),
            kind: Some("LoadBalancerGroup".into()),
            name: Some(group.to_owned()),
            ..Default::default()
        };
        self.warn(regarding, reason, message, "Plan").await
    }

    async fn warn(
        &self,
        regarding: ObjectReference,
        reason: &str,
        message: &str,
        action: &str,
    ) -> Result<(), kube::Error> {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(message.to_owned()),
            action: action.to_owned(),
            secondary: None,
        };
        self.recorder.publish(&event, &regarding).await
    }

    async fn finalizers(&self, namespace: &str, name: &str, finalizers: &[&str]) -> Result<(), kube::Error> {
        let body = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace, "finalizers": finalizers}});
        Api::<Service>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::apply(FINALIZER_MANAGER), &Patch::Apply(body))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    //! tower-test scenarios in the style of controller-rs's ApiServerVerifier: the exact
    //! requests, in order, with their bodies.

    use std::{collections::BTreeMap, net::IpAddr};

    use http::{Request, Response};
    use kube::client::Body;

    use super::*;
    use crate::k8s::status::StatusWrites;

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    async fn expect(
        handle: &mut Handle,
        method: &str,
        path_and_query: &str,
        body_check: impl FnOnce(serde_json::Value),
        reply: serde_json::Value,
    ) {
        let (request, send) = handle.next_request().await.expect("a request");
        assert_eq!(request.method().as_str(), method);
        assert_eq!(request.uri().path_and_query().unwrap().as_str(), path_and_query);
        let bytes = request.into_body().collect_bytes().await.unwrap();
        body_check(serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null));
        send.send_response(
            Response::builder().body(Body::from(serde_json::to_vec(&reply).unwrap())).unwrap(),
        );
    }

    fn service_reply(name: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"}})
    }

    #[tokio::test]
    async fn a_new_service_gets_finalizer_then_address_then_the_group_status() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writer = StatusWriter::new(Client::new(service, "default"), "n0".into());
        let key = ("shop".to_owned(), "web".to_owned());
        let mut groups = BTreeMap::new();
        groups.insert(
            "edge".to_owned(),
            crate::k8s::crd::LoadBalancerGroupStatus { member_count: 3, ..Default::default() },
        );
        let writes = StatusWrites {
            ingress: [(key.clone(), vec![IpAddr::from([198, 51, 100, 1])])].into(),
            add_finalizer: vec![key.clone()],
            groups,
            ..Default::default()
        };
        let server = tokio::spawn(async move {
            expect(
                &mut handle,
                "PATCH",
                "/api/v1/namespaces/shop/services/web?&fieldManager=lb-agent-ipam",
                |b| assert_eq!(b["metadata"]["finalizers"], json!(["lb-agent.io/ipam"])),
                service_reply("web"),
            )
            .await;
            expect(
                &mut handle,
                "PATCH",
                "/api/v1/namespaces/shop/services/web/status?&force=true&fieldManager=lb-agent",
                |b| {
                    assert_eq!(
                        b["status"]["loadBalancer"]["ingress"],
                        json!([{"ip": "198.51.100.1", "ipMode": "VIP"}])
                    )
                },
                service_reply("web"),
            )
            .await;
            expect(
                &mut handle,
                "PATCH",
                "/apis/lb-agent.io/v1alpha1/loadbalancergroups/edge/status?&force=true&fieldManager=lb-agent",
                |b| {
                    assert_eq!(b["kind"], "LoadBalancerGroup");
                    assert_eq!(b["status"]["memberCount"], 3);
                },
                json!({"apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge"}, "spec": {"interface": "eth0"}}),
            )
            .await;
            handle
        });
        writer.apply(&writes).await.expect("the writes apply");
        let mut handle = server.await.unwrap();
        // Nothing else was sent.
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), handle.next_request()).await.is_err()
        );
    }

    #[tokio::test]
    async fn refusals_become_warning_events_and_deleted_services_lose_the_finalizer() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writer = StatusWriter::new(Client::new(service, "default"), "n0".into());
        let key = ("shop".to_owned(), "web".to_owned());
        let condition = crate::k8s::status::ServiceCondition {
            status: "False",
            reason: "ExternalIPNotAllowed".into(),
            message: "externalIP 8.8.8.8 is outside …".into(),
            observed_generation: 3,
            last_transition_time: "2026-11-22T00:00:00Z".into(),
        };
        let writes = StatusWrites {
            warnings: vec![(key.clone(), "ExternalIPNotAllowed", "externalIP 8.8.8.8 is outside …".into())],
            conditions: [(key.clone(), condition)].into(),
            release: vec![("shop".to_owned(), "old".to_owned())],
            ..Default::default()
        };
        let server = tokio::spawn(async move {
            expect(
                &mut handle,
                "POST",
                "/apis/events.k8s.io/v1/namespaces/shop/events?",
                |b| {
                    assert_eq!(b["type"], "Warning");
                    assert_eq!(b["reason"], "ExternalIPNotAllowed");
                    assert_eq!(b["regarding"]["name"], "web");
                    assert_eq!(b["reportingController"], "lb-agent");
                    assert_eq!(b["reportingInstance"], "n0");
                },
                json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "shop"}, "eventTime": "2026-11-22T00:00:00.000000Z"}),
            )
            .await;
            expect(
                &mut handle,
                "PATCH",
                "/api/v1/namespaces/shop/services/web/status?&force=true&fieldManager=lb-agent-conditions",
                |b| {
                    let c = &b["status"]["conditions"][0];
                    assert_eq!(
                        (c["type"].as_str(), c["status"].as_str()),
                        (Some("lb-agent.io/Served"), Some("False"))
                    );
                    assert_eq!(c["reason"], "ExternalIPNotAllowed");
                    assert_eq!(c["observedGeneration"], 3);
                },
                service_reply("web"),
            )
            .await;
            expect(
                &mut handle,
                "PATCH",
                "/api/v1/namespaces/shop/services/old?&fieldManager=lb-agent-ipam",
                |b| assert_eq!(b["metadata"]["finalizers"], json!([])),
                service_reply("old"),
            )
            .await;
        });
        writer.apply(&writes).await.expect("the writes apply");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn an_api_error_stops_the_writes_and_is_returned() {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let writer = StatusWriter::new(Client::new(service, "default"), "n0".into());
        let key = ("shop".to_owned(), "web".to_owned());
        let writes = StatusWrites { add_finalizer: vec![key], ..Default::default() };
        let server = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.unwrap();
            let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "forbidden", "reason": "Forbidden", "code": 403});
            send.send_response(
                Response::builder()
                    .status(403)
                    .body(Body::from(serde_json::to_vec(&status).unwrap()))
                    .unwrap(),
            );
        });
        let error = writer.apply(&writes).await.expect_err("a 403 is an error");
        assert!(error.to_string().contains("forbidden"), "{error}");
        server.await.unwrap();
    }
}
