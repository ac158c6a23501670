//! Leader election through a `coordination.k8s.io` Lease, so exactly one agent writes status
//! and allocates addresses. Only those writes wait on it: VRRP and forwarding never do.
//!
//! The decision is pure ([`decide`]); [`LeaseLock`] is the shell. Updates carry the Lease's
//! resourceVersion, so two agents racing for an expired Lease cannot both win.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};

pub const LEASE_NAME: &str = "lb-agent-leader";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create,
    /// Ours: renew it.
    Renew,
    /// Someone else's and expired: take it over.
    TakeOver,
    /// Someone else's and current: follow.
    Follow,
}

pub fn decide(lease: Option<&LeaseSpec>, me: &str, now: Timestamp) -> Decision {
    let Some(spec) = lease else { return Decision::Create };
    if spec.holder_identity.as_deref() == Some(me) {
        return Decision::Renew;
    }
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let expired = match (&spec.holder_identity, &spec.renew_time) {
        (None, _) | (_, None) => true,
        (Some(_), Some(MicroTime(renewed))) => renewed.as_second() + duration < now.as_second(),
    };
    if expired { Decision::TakeOver } else { Decision::Follow }
}

pub struct LeaseLock {
    api: Api<Lease>,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
    pub fn new(client: Client, namespace: &str, identity: String, duration: Duration) -> Self {
        Self { api: Api::namespaced(client, namespace), identity, duration }
    }

    /// One round: returns whether this agent leads afterwards. A lost race is `Ok(false)`.
    pub async fn try_lead(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let current = self.api.get_opt(LEASE_NAME).await?;
        let decision = decide(current.as_ref().and_then(|l| l.spec.as_ref()), &self.identity, now);
        let spec = |transitions: i32, acquired: Option<MicroTime>| LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: acquired.or(Some(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        };
        let result = match (decision, current) {
            (Decision::Follow, _) => return Ok(false),
            (Decision::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(LEASE_NAME.into()), ..Default::default() },
                    spec: Some(spec(0, None)),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (decision, Some(mut lease)) => {
                let old = lease.spec.clone().unwrap_or_default();
                let transitions =
                    old.lease_transitions.unwrap_or(0) + i32::from(decision == Decision::TakeOver);
                let acquired = if decision == Decision::Renew { old.acquire_time } else { None };
                lease.spec = Some(spec(transitions, acquired));
                // `replace` sends the resourceVersion we read: a concurrent writer makes it 409.
                self.api.replace(LEASE_NAME, &PostParams::default(), &lease).await
            }
            (_, None) => return Ok(false),
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

impl LeaseLock {
    /// Gives the Lease up, if this agent holds it: no holder, so the next agent to try takes
    /// it at once (client-go's ReleaseOnCancel does the same). The resourceVersion read makes
    /// a release that races a takeover a 409, which changes nothing.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(LEASE_NAME).await? else { return Ok(()) };
        let Some(spec) = lease.spec.as_mut().filter(|s| s.holder_identity.as_deref() == Some(&self.identity))
        else {
            return Ok(());
        };
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        match self.api.replace(LEASE_NAME, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: Option<&str>, renewed_seconds_ago: i64) -> LeaseSpec {
        let now = Timestamp::now();
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(
                Timestamp::from_second(now.as_second() - renewed_seconds_ago).unwrap(),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn decisions() {
        let now = Timestamp::now();
        assert_eq!(decide(None, "n0", now), Decision::Create);
        assert_eq!(decide(Some(&spec(Some("n0"), 100)), "n0", now), Decision::Renew);
        assert_eq!(decide(Some(&spec(Some("n1"), 5)), "n0", now), Decision::Follow);
        assert_eq!(decide(Some(&spec(Some("n1"), 16)), "n0", now), Decision::TakeOver);
        assert_eq!(decide(Some(&spec(None, 0)), "n0", now), Decision::TakeOver);
    }

    mod api {
        use http::{Request, Response};
        use kube::client::Body;
        use serde_json::json;

        use super::super::*;

        #[tokio::test]
        async fn an_absent_lease_is_created_and_a_lost_race_follows() {
            let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let lock = LeaseLock::new(
                Client::new(service, "default"),
                "lb-agent",
                "n0".into(),
                Duration::from_secs(15),
            );
            let server = tokio::spawn(async move {
                let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"});
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(
                    request.uri().path(),
                    "/apis/coordination.k8s.io/v1/namespaces/lb-agent/leases/lb-agent-leader"
                );
                send.send_response(
                    Response::builder()
                        .status(404)
                        .body(Body::from(serde_json::to_vec(&not_found).unwrap()))
                        .unwrap(),
                );
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(request.method(), "POST");
                let body: serde_json::Value =
                    serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
                assert_eq!(body["spec"]["holderIdentity"], "n0");
                assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
                send.send_response(
                    Response::builder().body(Body::from(serde_json::to_vec(&body).unwrap())).unwrap(),
                );

                // Second round: someone else took it a moment ago.
                let (_, send) = handle.next_request().await.unwrap();
                let theirs = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lb-agent-leader", "resourceVersion": "7"},
                    "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 15, "renewTime": Timestamp::now().to_string()}});
                send.send_response(
                    Response::builder().body(Body::from(serde_json::to_vec(&theirs).unwrap())).unwrap(),
                );
            });
            assert!(lock.try_lead().await.unwrap(), "created: leading");
            assert!(!lock.try_lead().await.unwrap(), "n1 holds a current lease: following");
            server.await.unwrap();
        }

        #[tokio::test]
        async fn a_release_gives_up_only_a_lease_this_agent_holds() {
            let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let lock = LeaseLock::new(
                Client::new(service, "default"),
                "lb-agent",
                "n0".into(),
                Duration::from_secs(15),
            );
            let lease = |holder: &str| {
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "lb-agent-leader", "resourceVersion": "7"},
                    "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": 3, "renewTime": Timestamp::now().to_string()}})
            };
            let reply = |v: serde_json::Value| {
                Response::builder().body(Body::from(serde_json::to_vec(&v).unwrap())).unwrap()
            };
            let server = tokio::spawn(async move {
                let (_, send) = handle.next_request().await.unwrap();
                send.send_response(reply(lease("n0")));
                let (request, send) = handle.next_request().await.unwrap();
                assert_eq!(request.method(), "PUT");
                let body: serde_json::Value =
                    serde_json::from_slice(&request.into_body().collect_bytes().await.unwrap()).unwrap();
                assert!(body["spec"].get("holderIdentity").is_none(), "no holder: {body}");
                assert_eq!(body["spec"]["leaseDurationSeconds"], 1);
                assert_eq!(body["spec"]["leaseTransitions"], 3, "the term is the taker's to count");
                assert_eq!(body["metadata"]["resourceVersion"], "7", "a release that races a takeover fails");
                send.send_response(reply(body));
                // Someone else's: nothing is written (the mock would see a second request).
                let (_, send) = handle.next_request().await.unwrap();
                send.send_response(reply(lease("n1")));
            });
            lock.release().await.unwrap();
            lock.release().await.unwrap();
            server.await.unwrap();
        }
    }
}
