//! The incremental translator: only changed Services are translated again, with the whole
//! translation's result.

use super::*;

#[test]
fn a_translator_rebuilds_only_the_services_whose_objects_changed() {
    let base = Config::parse(BASE).unwrap();
    let mut state = cluster();
    let versioned = |state: &mut ClusterState, version: &str| {
        for s in &mut state.services {
            Arc::make_mut(s).metadata.resource_version = Some(version.into());
        }
        for s in &mut state.slices {
            Arc::make_mut(s).metadata.resource_version = Some(version.into());
        }
    };
    versioned(&mut state, "1");
    let mut translator = Translator::default();
    assert_eq!(translator.translate(&state, &base).unwrap().config, translate(&state, &base).unwrap().config);
    assert_eq!(translator.rebuilt(), 2);
    assert_eq!(translator.translate(&state, &base).unwrap().config, translate(&state, &base).unwrap().config);
    assert_eq!(translator.rebuilt(), 0, "nothing changed");

    // One EndpointSlice changes: only its Service is rebuilt, and the result is the
    // whole translation's.
    let web = state.slices.iter_mut().find(|s| s.metadata.name.as_deref() == Some("web-a")).unwrap();
    let web = Arc::make_mut(web);
    web.endpoints[0].addresses = vec!["10.244.1.6".into()];
    web.metadata.resource_version = Some("2".into());
    let incremental = translator.translate(&state, &base).unwrap().config;
    assert_eq!(translator.rebuilt(), 1);
    assert_eq!(incremental, translate(&state, &base).unwrap().config);
    assert!(
        incremental
            .services
            .iter()
            .any(|s| s.endpoints.iter().any(|e| e.address.to_string() == "10.244.1.6"))
    );

    // The same objects relisted (new allocations, the same resource versions): reused.
    for s in &mut state.services {
        *s = Arc::new(Service::clone(s));
    }
    for s in &mut state.slices {
        *s = Arc::new(Slice::clone(s));
    }
    assert_eq!(translator.translate(&state, &base).unwrap().config, translate(&state, &base).unwrap().config);
    assert_eq!(translator.rebuilt(), 0, "a relist of unchanged objects");

    // A group's spec changes (its allowed externalIPs): every Service is bound afresh.
    Arc::make_mut(&mut state.groups[0]).spec.allowed_external_ips = vec![];
    let rebound = translator.translate(&state, &base).unwrap().config;
    assert_eq!(rebound, translate(&state, &base).unwrap().config);
    assert_eq!(translator.rebuilt(), 2);
    // Its status (the leader's VRIDs) is not an input of any Service.
    Arc::make_mut(&mut state.groups[0]).status = Some(Default::default());
    translator.translate(&state, &base).unwrap();
    assert_eq!(translator.rebuilt(), 0);

    // Objects without resource versions are reused only as the same allocation.
    versioned(&mut state, "");
    for s in &mut state.services {
        Arc::make_mut(s).metadata.resource_version = None;
    }
    translator.translate(&state, &base).unwrap();
    assert_eq!(translator.rebuilt(), 2);
    translator.translate(&state, &base).unwrap();
    assert_eq!(translator.rebuilt(), 0);
    for s in &mut state.services {
        *s = Arc::new(Service::clone(s));
    }
    translator.translate(&state, &base).unwrap();
    assert_eq!(translator.rebuilt(), 2);
}

/// A Service `s{i}` at 198.51.100.{i}, port `port`, and its EndpointSlice, at version `v`.
fn numbered(i: u8, port: u16, endpoint: u8, v: u32) -> (Arc<Service>, Arc<Slice>) {
    let service = serde_yaml::from_str(&format!(
        "metadata: {{name: s{i}, namespace: ns, uid: u{i}, resourceVersion: '{v}'}}\n\
             spec: {{type: LoadBalancer, ports: [{{port: {port}}}]}}\n\
             status: {{loadBalancer: {{ingress: [{{ip: 198.51.100.{}}}]}}}}",
        i % 8 + 1
    ))
    .unwrap();
    let slice = serde_yaml::from_str(&format!(
            "metadata: {{name: s{i}-a, namespace: ns, uid: e{i}, resourceVersion: '{v}', labels: {{kubernetes.io/service-name: s{i}}}}}\n\
             addressType: IPv4\nendpoints: [{{addresses: [10.244.1.{endpoint}], nodeName: n1}}, {{addresses: [10.244.2.{endpoint}], nodeName: n0}}]"
        ))
        .unwrap();
    (Arc::new(service), Arc::new(slice))
}

proptest::proptest! {
    /// Any sequence of Service and EndpointSlice changes, passed as changed Services,
    /// gives what translating the whole state afresh gives: endpoint moves (patched in
    /// place), new and deleted Services, port changes and conflicts (assembled again).
    #[test]
    fn changed_services_give_the_whole_translation(
        steps in proptest::collection::vec((0u8..4, 0u8..12, 1u8..200), 1..40),
    ) {
        let base = Config::parse(BASE).unwrap();
        let mut state = cluster();
        state.services.clear();
        state.slices.clear();
        for i in 0..6 {
            let (service, slice) = numbered(i, 80, 1, 1);
            state.services.push(service);
            state.slices.push(slice);
        }
        let mut translator = Translator::default();
        translator.translate(&state, &base).unwrap();
        for (step, (op, i, x)) in steps.into_iter().enumerate() {
            let version = step as u32 + 2;
            let name = format!("s{i}");
            let at = state.services.iter().position(|s| s.metadata.name.as_deref() == Some(&name));
            let port = at.and_then(|a| state.services[a].spec.as_ref()?.ports.as_ref()?.first().map(|p| p.port as u16)).unwrap_or(80);
            match (op, at) {
                // An endpoint moves.
                (0, Some(a)) => state.slices[a] = numbered(i, port, x, version).1,
                // The Service goes.
                (1, Some(a)) => {
                    state.services.remove(a);
                    state.slices.remove(a);
                }
                // It comes, or changes its port (which may clash with another's).
                (_, Some(a)) => state.services[a] = numbered(i, 80 + u16::from(x % 3), x, version).0,
                (_, None) => {
                    let (service, slice) = numbered(i, 80 + u16::from(x % 3), x, version);
                    state.services.push(service);
                    state.slices.push(slice);
                }
            }
            let objects = ServiceObjects {
                namespace: "ns".into(),
                name: name.clone(),
                service: state.services.iter().find(|s| s.metadata.name.as_deref() == Some(&name)).cloned(),
                slices: state.slices.iter().filter(|s| s.metadata.name.as_deref() == Some(&format!("{name}-a"))).cloned().collect(),
            };
            // The delta pass reads no services or slices from the state.
            let groups_only = ClusterState { services: vec![], slices: vec![], ..state.clone() };
            let delta = translator.translate_changed(&groups_only, &base, Changed::Services(vec![objects])).unwrap();
            let whole = translate(&state, &base).unwrap();
            proptest::prop_assert_eq!(&delta, &whole, "step {}", step);
            proptest::prop_assert!(translator.rebuilt() <= 1);
        }
    }
}
