//! Behaviour across many objects against kube-fake-client's in-memory API (kube 4.2 was
//! picked so this fake could be used): the leader's plan-and-write loop converges, gives every
//! Service at most one address from the pool, never one address twice, and then writes nothing.

use std::{collections::BTreeSet, net::IpAddr};

use k8s_openapi::api::core::v1::{Node, Service};
use kube::{Api, api::ListParams};
use kube_fake_client::ClientBuilder;
use lb_agent::k8s::{
    cluster::{self, ClusterState},
    crd::LoadBalancerGroup,
    status::{self, IPAM_FINALIZER, SERVICE_CONDITION},
    writer::StatusWriter,
};

fn service(i: usize) -> Service {
    serde_yaml::from_str(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: s{i:02}, namespace: shop}}\nspec: {{type: LoadBalancer, ports: [{{port: 80}}]}}"
    ))
    .unwrap()
}

fn shared<T>(items: Vec<T>) -> Vec<std::sync::Arc<T>> {
    items.into_iter().map(std::sync::Arc::new).collect()
}

async fn state(client: &kube::Client) -> ClusterState {
    let lp = ListParams::default();
    ClusterState {
        groups: shared(Api::<LoadBalancerGroup>::all(client.clone()).list(&lp).await.unwrap().items),
        services: shared(Api::<Service>::all(client.clone()).list(&lp).await.unwrap().items),
        nodes: shared(Api::<Node>::all(client.clone()).list(&lp).await.unwrap().items),
        ..Default::default()
    }
}

#[tokio::test]
async fn the_leader_converges_and_never_hands_out_an_address_twice() {
    let group: LoadBalancerGroup = serde_yaml::from_str(
        "apiVersion: lb-agent.io/v1alpha1\nkind: LoadBalancerGroup\nmetadata: {name: edge}\nspec: {interface: eth0, addressPools: [198.51.100.0/28], default: true}",
    )
    .unwrap();
    let node: Node = serde_yaml::from_str(
        "apiVersion: v1\nkind: Node\nmetadata: {name: n0}\nstatus: {addresses: [{type: InternalIP, address: 192.0.2.10}]}",
    )
    .unwrap();
    let client = ClientBuilder::new()
        .with_resource::<LoadBalancerGroup>()
        .with_object(group)
        .with_object(node)
        .with_objects((0..20).map(service).collect())
        .with_status_subresource::<Service>()
        .build()
        .await
        .expect("the fake API");
    let writer = StatusWriter::new(client.clone(), "n0".into());

    let mut rounds = 0;
    loop {
        let state = state(&client).await;
        let config = lb_agent::k8s::source::translate(
            &state,
            &lb_agent::config::Config::parse("interface: eth0\nnode: n0\n").unwrap(),
        )
        .expect("a valid config")
        .config;
        let planned = lb_agent::node_plan::node_plan(&config, "n0");
        let plan = status::writes(
            &state,
            &Default::default(),
            &planned,
            &Default::default(),
            &[],
            "2026-11-22T00:00:00Z",
        );
        if plan.ingress.is_empty() && plan.add_finalizer.is_empty() && plan.conditions.is_empty() {
            break;
        }
        // Events (events.k8s.io) and the cluster-scoped group's status subresource are beyond
        // this fake (it answers the group's status patch with 404): the tower-test scenarios
        // check those requests instead.
        let plan = status::StatusWrites { warnings: Vec::new(), groups: Default::default(), ..plan };
        writer.apply(&plan).await.expect("the writes succeed");
        rounds += 1;
        assert!(rounds <= 3, "no convergence after {rounds} rounds: {plan:#?}");
    }

    let services =
        Api::<Service>::namespaced(client.clone(), "shop").list(&ListParams::default()).await.unwrap().items;
    let mut seen = BTreeSet::new();
    let (mut served, mut refused) = (0, 0);
    for s in &services {
        let ips: Vec<IpAddr> = cluster::current_ingress(s);
        let condition = s
            .status
            .as_ref()
            .and_then(|st| st.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == SERVICE_CONDITION))
            .expect("every Service has the condition");
        assert!(s.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|x| x == IPAM_FINALIZER)));
        match ips.as_slice() {
            [ip] => {
                assert!(seen.insert(*ip), "{ip} given twice");
                assert_eq!(condition.status, "True");
                served += 1;
            }
            [] => {
                assert_eq!(
                    (condition.status.as_str(), condition.reason.as_str()),
                    ("False", "PoolExhausted")
                );
                refused += 1;
            }
            more => panic!("{more:?}"),
        }
    }
    // A /28 holds 14 usable addresses.
    assert_eq!((served, refused), (14, 6));
}
