//! The lab's API server checked against kube-apiserver's behaviours that lb-agent relies on,
//! through kube's own client: list and watch with resource versions and 410 Gone, pages,
//! status subresources, merge patches, server-side apply with field managers and conflicts,
//! 409 on a stale write, finalizers, validation against the CRD, RBAC from the manifests,
//! and the faults (down, 429).
//!
//! Nothing here needs root: the server runs in the test's own network namespace.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Secret, Service},
};
use kube::{
    Api, Client,
    api::{
        ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams, WatchEvent,
        WatchParams,
    },
    runtime::watcher,
};
use lb_lab::api_server::ApiServer;
use serde_json::{Value, json};

fn server() -> ApiServer {
    ApiServer::start(None, "127.0.0.1:0".parse::<SocketAddr>().unwrap())
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"},
           "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP"}]}})
}

fn groups(client: Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("lb-agent.io", "v1alpha1", "LoadBalancerGroup");
    Api::all_with(client, &ApiResource::from_gvk(&gvk))
}

fn code(error: kube::Error) -> u16 {
    match error {
        kube::Error::Api(e) => e.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn watches_resume_from_a_resource_version_and_an_expired_one_is_410() {
    let server = server();
    let services: Api<Service> = Api::namespaced(server.client("admin", true).await, "shop");
    for name in ["a", "b"] {
        server.put(service(name));
    }
    let listed = services.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 2);
    let rv = listed.metadata.resource_version.clone().unwrap();

    server.put(service("c"));
    let mut events = services.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Added(s)) => {
            assert_eq!(s.metadata.name.as_deref(), Some("c"), "only what came after {rv}")
        }
        other => panic!("expected c added, got {other:?}"),
    }
    services.delete("a", &Default::default()).await.unwrap();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Deleted(s)) => assert_eq!(s.metadata.name.as_deref(), Some("a")),
        other => panic!("expected a deleted, got {other:?}"),
    }

    server.expire_watches();
    assert!(events.try_next().await.unwrap().is_none(), "an expiry ends open watches");
    let mut stale = services.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    match stale.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected 410 Gone, got {other:?}"),
    }

    // kube's watcher lists again and carries on.
    let mut seen = watcher(services.clone(), watcher::Config::default()).boxed();
    let mut names = Vec::new();
    while let Some(event) = seen.try_next().await.unwrap() {
        match event {
            watcher::Event::InitApply(s) => names.push(s.metadata.name.unwrap()),
            watcher::Event::InitDone => break,
            _ => {}
        }
    }
    names.sort();
    assert_eq!(names, ["b", "c"]);
    server.expire_watches();
    server.put(service("d"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let event = tokio::time::timeout_at(deadline.into(), seen.try_next())
            .await
            .expect("the watcher recovers")
            .unwrap();
        if let Some(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) = event
            && s.metadata.name.as_deref() == Some("d")
        {
            break;
        }
    }
}

#[tokio::test]
async fn lists_come_in_pages_with_one_resource_version() {
    let server = server();
    for i in 0..5 {
        server.put(service(&format!("s{i}")));
    }
    let services: Api<Service> = Api::namespaced(server.client("admin", true).await, "shop");
    let first = services.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(first.items.len(), 2);
    let token = first.metadata.continue_.clone().expect("a continue token");
    server.put(service("late"));
    let second = services.list(&ListParams::default().limit(10).continue_token(&token)).await.unwrap();
    assert_eq!(
        second.items.len(),
        4,
        "the rest of the first list, and the one created since: {:?}",
        second.items
    );
    assert_eq!(second.metadata.resource_version, first.metadata.resource_version);
    server.expire_watches();
    let err = services.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap_err();
    assert_eq!(code(err), 410);
}

#[tokio::test]
async fn status_is_a_subresource_and_spec_changes_bump_generation() {
    let server = server();
    let services: Api<Service> = Api::namespaced(server.client("admin", true).await, "shop");
    let mut with_status = service("web");
    with_status["status"] = json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}});
    let created =
        services.create(&PostParams::default(), &serde_json::from_value(with_status).unwrap()).await.unwrap();
    assert!(
        created.status.and_then(|s| s.load_balancer).and_then(|l| l.ingress).is_none(),
        "a create sets no status"
    );
    assert_eq!(created.metadata.generation, Some(1));

    let status = json!({"status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}, "spec": {"type": "ClusterIP"}});
    let s = services.patch_status("web", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    assert_eq!(s.spec.unwrap().type_.as_deref(), Some("LoadBalancer"), "a status write leaves spec");
    assert_eq!(
        s.status.unwrap().load_balancer.unwrap().ingress.unwrap()[0].ip.as_deref(),
        Some("198.51.100.1")
    );
    assert_eq!(s.metadata.generation, Some(1));

    let main =
        json!({"status": {"loadBalancer": {"ingress": []}}, "spec": {"externalTrafficPolicy": "Local"}});
    let s = services.patch("web", &PatchParams::default(), &Patch::Merge(&main)).await.unwrap();
    assert_eq!(
        s.status.unwrap().load_balancer.unwrap().ingress.unwrap().len(),
        1,
        "a main write leaves status"
    );
    assert_eq!(s.metadata.generation, Some(2));
}

#[tokio::test]
async fn server_side_apply_merges_by_list_type_and_owner() {
    let server = server();
    server.put(service("web"));
    let services: Api<Service> = Api::namespaced(server.client("admin", true).await, "shop");
    let finalizers = |list: &[&str]| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "finalizers": list}});
    let apply = |manager: &str| PatchParams::apply(manager);
    services.patch("web", &apply("user"), &Patch::Apply(finalizers(&["example.com/keep"]))).await.unwrap();
    let s = services
        .patch("web", &apply("lb-agent-ipam"), &Patch::Apply(finalizers(&["lb-agent.io/ipam"])))
        .await
        .unwrap();
    assert_eq!(s.metadata.finalizers.unwrap(), ["example.com/keep", "lb-agent.io/ipam"], "a set merges");
    let s = services.patch("web", &apply("lb-agent-ipam"), &Patch::Apply(finalizers(&[]))).await.unwrap();
    assert_eq!(
        s.metadata.finalizers.unwrap(),
        ["example.com/keep"],
        "applying none removes only the applier's own"
    );

    // Conditions merge by type; each manager's stays.
    let condition = |t: &str, status: &str| {
        json!({"apiVersion": "v1", "kind": "Service", "status": {"conditions": [
            {"type": t, "status": status, "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}})
    };
    services
        .patch_status("web", &apply("other").force(), &Patch::Apply(condition("Other", "True")))
        .await
        .unwrap();
    let s = services
        .patch_status("web", &apply("lb-agent").force(), &Patch::Apply(condition("Ours", "False")))
        .await
        .unwrap();
    let types: Vec<String> = s.status.unwrap().conditions.unwrap().into_iter().map(|c| c.type_).collect();
    assert_eq!(types, ["Other", "Ours"]);

    // Another manager's field with a different value: a conflict unless forced.
    let policy =
        |p: &str| json!({"apiVersion": "v1", "kind": "Service", "spec": {"externalTrafficPolicy": p}});
    let mut users = policy("Local");
    users["metadata"] = json!({"finalizers": ["example.com/keep"]});
    services.patch("web", &apply("user"), &Patch::Apply(users)).await.unwrap();
    let err = services.patch("web", &apply("lb-agent"), &Patch::Apply(policy("Cluster"))).await.unwrap_err();
    assert_eq!(code(err), 409);
    services
        .patch("web", &apply("lb-agent"), &Patch::Apply(policy("Local")))
        .await
        .expect("the same value is shared");
    let s =
        services.patch("web", &apply("lb-agent").force(), &Patch::Apply(policy("Cluster"))).await.unwrap();
    assert_eq!(s.spec.unwrap().external_traffic_policy.as_deref(), Some("Cluster"));
    let managed = s.metadata.managed_fields.unwrap();
    let user =
        managed.iter().find(|m| m.manager.as_deref() == Some("user")).expect("user still owns its finalizer");
    assert!(
        !user.fields_v1.as_ref().unwrap().0.to_string().contains("externalTrafficPolicy"),
        "forced: taken over"
    );

    // A re-apply that changes nothing is not a write.
    let rv = s.metadata.resource_version;
    let again =
        services.patch("web", &apply("lb-agent").force(), &Patch::Apply(policy("Cluster"))).await.unwrap();
    assert_eq!(again.metadata.resource_version, rv);
    let err =
        services.patch("web", &PatchParams::default(), &Patch::Apply(policy("Local"))).await.unwrap_err();
    assert_eq!(code(err), 400, "an apply names its field manager");
    // An apply creates what is missing, validated: a bare Service is refused.
    let bare = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bare", "finalizers": []}});
    let err = services.patch("bare", &apply("lb-agent-ipam"), &Patch::Apply(bare)).await.unwrap_err();
    assert_eq!(code(err), 422);
}

#[tokio::test]
async fn a_stale_write_is_409_and_deletes_wait_for_finalizers() {
    let server = server();
    let leases: Api<Lease> = Api::namespaced(server.client("admin", true).await, "lb-agent");
    let lease: Lease = serde_json::from_value(
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "n0", "leaseDurationSeconds": 15}}),
    )
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(code(leases.create(&PostParams::default(), &lease).await.unwrap_err()), 409, "AlreadyExists");
    let mut mine = created.clone();
    mine.spec.as_mut().unwrap().holder_identity = Some("n1".into());
    leases.replace("l", &PostParams::default(), &mine).await.unwrap();
    let mut theirs = created;
    theirs.spec.as_mut().unwrap().holder_identity = Some("n2".into());
    let err = leases.replace("l", &PostParams::default(), &theirs).await.unwrap_err();
    assert_eq!(code(err), 409, "written from a resourceVersion that is no longer current");

    let services: Api<Service> = Api::namespaced(server.client("admin", true).await, "shop");
    let mut s = service("gone");
    s["metadata"]["finalizers"] = json!(["lb-agent.io/ipam"]);
    server.put(s);
    services.delete("gone", &Default::default()).await.unwrap();
    let marked = services.get("gone").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some(), "marked, kept for its finalizer");
    services
        .patch("gone", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    assert_eq!(
        code(services.get("gone").await.unwrap_err()),
        404,
        "the last finalizer gone, so is the object"
    );
}

#[tokio::test]
async fn groups_are_validated_against_the_crd_and_defaulted() {
    let server = server();
    let api = groups(server.client("admin", true).await);
    let group = |spec: Value| {
        serde_json::from_value::<DynamicObject>(
            json!({"apiVersion": "lb-agent.io/v1alpha1", "kind": "LoadBalancerGroup", "metadata": {"name": "edge"}, "spec": spec}),
        )
        .unwrap()
    };
    let err = api
        .create(&PostParams::default(), &group(json!({"addressPools": "198.51.100.0/29"})))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(e) => {
            assert_eq!(e.code, 422);
            assert!(e.message.contains("addressPools"), "names the field: {}", e.message);
        }
        other => panic!("{other}"),
    }
    let created = api
        .create(&PostParams::default(), &group(json!({"addressPools": ["198.51.100.0/29"]})))
        .await
        .unwrap();
    assert!(created.data["spec"].get("remoteMode").is_some(), "defaults filled in: {}", created.data);
}

#[tokio::test]
async fn the_agents_get_what_the_rbac_manifests_grant_and_nothing_else() {
    let server = server();
    server.put(service("web"));
    let agent = server.client("n0", false).await;
    let services: Api<Service> = Api::namespaced(agent.clone(), "shop");
    services.list(&ListParams::default()).await.expect("services are listed");
    let status = json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}});
    services
        .patch_status("web", &PatchParams::apply("lb-agent").force(), &Patch::Apply(status))
        .await
        .expect("status is written");
    let svc = services.get("web").await.unwrap();
    assert_eq!(
        code(services.replace("web", &PostParams::default(), &svc).await.unwrap_err()),
        403,
        "no update of a Service"
    );
    assert_eq!(code(services.delete("web", &Default::default()).await.unwrap_err()), 403);
    let secrets: Api<Secret> = Api::namespaced(agent.clone(), "shop");
    assert_eq!(code(secrets.list(&ListParams::default()).await.unwrap_err()), 403, "no Secrets");
    let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "lb-agent-leader"}})).unwrap();
    Api::<Lease>::namespaced(agent.clone(), "lb-agent")
        .create(&PostParams::default(), &lease)
        .await
        .expect("its Lease");
    let elsewhere =
        Api::<Lease>::namespaced(agent, "default").create(&PostParams::default(), &lease).await.unwrap_err();
    assert_eq!(code(elsewhere), 403, "the Role binds in lb-agent only");
}

#[tokio::test]
async fn down_refuses_connections_and_throttled_is_429() {
    let server = server();
    let services: Api<Service> = Api::namespaced(server.client("admin", true).await, "shop");
    services.list(&ListParams::default()).await.unwrap();
    server.set_down(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err(), "refused while down");
    server.set_down(false);
    let deadline = Instant::now() + Duration::from_secs(5);
    while tokio::net::TcpStream::connect(server.addr).await.is_err() {
        assert!(Instant::now() < deadline, "serving again");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    services.list(&ListParams::default()).await.expect("served again");
    // kube's client waits the Retry-After and tries again.
    server.throttle(2);
    let started = Instant::now();
    services.list(&ListParams::default()).await.expect("served after two 429s");
    assert!(started.elapsed() >= Duration::from_secs(2), "each retry waited its Retry-After");
    let codes: Vec<u16> = server.requests().iter().rev().take(3).map(|r| r.code).collect();
    assert_eq!(codes, [200, 429, 429]);
}
