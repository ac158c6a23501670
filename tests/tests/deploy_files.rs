//! The shipped configuration and manifests must stay valid.

use std::path::Path;

#[test]
fn the_standalone_example_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/standalone/lb-agent.yaml");
    let config = lb_agent::config::Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.vips.len(), 2);
    assert_eq!(config.services.len(), 2);
    let plan: lb_agent::map_contents::MapContents = lb_agent::map_contents::for_node(&config, "node-b");
    assert!(!plan.local_endpoints.is_empty());
}

/// Every manifest in `deploy/` parses into the k8s-openapi type of its kind, and the
/// kustomization lists files that exist.
#[test]
fn every_manifest_parses_into_its_kubernetes_type() {
    use k8s_openapi::{
        api::{
            apps::v1::DaemonSet,
            core::v1::{ConfigMap, Namespace, ServiceAccount},
            rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
        },
        apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    };
    use serde::Deserialize;

    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let kustomization: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(deploy.join("kustomization.yaml")).unwrap()).unwrap();
    let resources: Vec<String> = kustomization["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let mut kinds = Vec::new();
    for resource in &resources {
        let text =
            std::fs::read_to_string(deploy.join(resource)).unwrap_or_else(|e| panic!("{resource}: {e}"));
        for document in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(document).unwrap();
            let kind = value["kind"]
                .as_str()
                .unwrap_or_else(|| panic!("{resource}: a document without kind"))
                .to_owned();
            let parsed = match kind.as_str() {
                "Namespace" => serde_yaml::from_value::<Namespace>(value).map(|_| ()),
                "ServiceAccount" => serde_yaml::from_value::<ServiceAccount>(value).map(|_| ()),
                "ClusterRole" => serde_yaml::from_value::<ClusterRole>(value).map(|_| ()),
                "ClusterRoleBinding" => serde_yaml::from_value::<ClusterRoleBinding>(value).map(|_| ()),
                "Role" => serde_yaml::from_value::<Role>(value).map(|_| ()),
                "RoleBinding" => serde_yaml::from_value::<RoleBinding>(value).map(|_| ()),
                "ConfigMap" => serde_yaml::from_value::<ConfigMap>(value.clone()).map(|cm| {
                    // The agent settings inside must be a valid config.
                    let text = &cm.data.unwrap()["lb-agent.yaml"];
                    lb_agent::config::Config::parse(text).unwrap_or_else(|e| panic!("{resource}: {e}"));
                }),
                "DaemonSet" => serde_yaml::from_value::<DaemonSet>(value).map(|ds| {
                    let pod = ds.spec.unwrap().template.spec.unwrap();
                    assert_eq!(pod.host_network, Some(true));
                    let c = &pod.containers[0];
                    let caps = c.security_context.as_ref().unwrap().capabilities.as_ref().unwrap();
                    assert!(!caps.add.as_ref().unwrap().contains(&"SYS_ADMIN".to_owned()), "no SYS_ADMIN");
                    assert!(c.liveness_probe.is_some() && c.readiness_probe.is_some());
                    let security = c.security_context.as_ref().unwrap();
                    let seccomp = security.seccomp_profile.as_ref().expect("a seccomp profile");
                    assert_eq!(seccomp.type_, "RuntimeDefault");
                    assert_eq!(security.allow_privilege_escalation, Some(false));
                    assert_eq!(security.read_only_root_filesystem, Some(true));
                    // Memory bounded; CPU not, on purpose (see the manifest's comment).
                    let resources = c.resources.as_ref().unwrap();
                    let limits = resources.limits.as_ref().unwrap();
                    assert!(limits.contains_key("memory") && !limits.contains_key("cpu"), "{limits:?}");
                    // The VRRP keys: a Secret mounted if it exists, readable by root only.
                    let keys = pod.volumes.iter().flatten().find(|v| v.name == "vrrp-keys").unwrap();
                    let secret = keys.secret.as_ref().unwrap();
                    assert_eq!(secret.optional, Some(true));
                    assert_eq!(secret.default_mode, Some(0o400));
                    assert!(c.volume_mounts.iter().flatten().any(|m| m.name == "vrrp-keys"
                        && m.read_only == Some(true)
                        && m.mount_path == "/etc/lb-agent-vrrp-keys"));
                    // The admin socket's directory is the host's, where an operator reaches it.
                    let socket_dir =
                        std::path::Path::new(lb_agent::config::DEFAULT_ADMIN_SOCKET).parent().unwrap();
                    let mount =
                        c.volume_mounts.iter().flatten().find(|m| Path::new(&m.mount_path) == socket_dir);
                    let mount = mount.expect("the admin socket's directory is mounted");
                    let volume = pod.volumes.iter().flatten().find(|v| v.name == mount.name).unwrap();
                    assert_eq!(volume.host_path.as_ref().map(|h| Path::new(&h.path)), Some(socket_dir));
                }),
                "CustomResourceDefinition" => {
                    serde_yaml::from_value::<CustomResourceDefinition>(value).map(|_| ())
                }
                other => panic!("{resource}: unexpected kind {other}"),
            };
            parsed.unwrap_or_else(|e| panic!("{resource}: {kind}: {e}"));
            kinds.push(kind);
        }
    }
    for kind in ["CustomResourceDefinition", "ClusterRole", "DaemonSet", "ServiceAccount"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in deploy/");
    }
    // Least privilege: no rule touches Secrets.
    let rbac = std::fs::read_to_string(deploy.join("rbac.yaml")).unwrap();
    assert!(!rbac.contains("secrets"), "the agent must not read Secrets");
}

#[test]
#[cfg_attr(
    no_kustomize,
    ignore = "needs kubectl 1.21 or later, which Debian 12 does not carry: see cargo xtask setup"
)]
fn kustomize_renders_the_release_image_tag() {
    // `kubectl kustomize` renders offline; the DaemonSet gets the workspace's version.
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let out = std::process::Command::new("kubectl")
        .args(["kustomize", deploy.to_str().unwrap()])
        .output()
        .expect("kubectl 1.21 or later");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rendered = String::from_utf8(out.stdout).unwrap();
    let mut images = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&rendered) {
        let value = <serde_yaml::Value as serde::Deserialize>::deserialize(document).unwrap();
        if value["kind"] == "DaemonSet" {
            let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_yaml::from_value(value).unwrap();
            let pod = ds.spec.unwrap().template.spec.unwrap();
            images.extend(pod.containers.iter().filter_map(|c| c.image.clone()));
        }
    }
    assert_eq!(images, [format!("lb-agent:{}", env!("CARGO_PKG_VERSION"))]);
}

/// Routed groups: the `deploy/frr` component adds FRR as a native sidecar (its config from the
/// generated ConfigMap) and the agent's TUN device; the base renders neither.
#[test]
#[cfg_attr(
    no_kustomize,
    ignore = "needs kubectl 1.21 or later, which Debian 12 does not carry: see cargo xtask setup"
)]
fn the_frr_component_adds_the_routing_sidecar_and_the_tun_device_to_the_base() {
    let render = |dir: &Path| {
        let out = std::process::Command::new("kubectl")
            .args(["kustomize", dir.to_str().unwrap()])
            .output()
            .expect("kubectl 1.21 or later");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rendered = String::from_utf8(out.stdout).unwrap();
        serde_yaml::Deserializer::from_str(&rendered)
            .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).unwrap())
            .find(|v| v["kind"] == "DaemonSet")
            .map(|v| serde_yaml::from_value::<k8s_openapi::api::apps::v1::DaemonSet>(v).unwrap())
            .expect("a DaemonSet")
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
    };
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy").canonicalize().unwrap();
    let base = render(&deploy);
    assert!(base.init_containers.is_none(), "the base runs no routing daemon");
    assert!(!base.volumes.iter().flatten().any(|v| v.name == "dev-net-tun"));

    // A site's overlay beside the release's deploy/, as the README shows.
    let site = std::env::temp_dir().join(format!("lb-site-{}", std::process::id()));
    std::fs::create_dir_all(site.join("site")).unwrap();
    let _ = std::fs::remove_file(site.join("deploy"));
    std::os::unix::fs::symlink(&deploy, site.join("deploy")).unwrap();
    std::fs::write(
        site.join("site/kustomization.yaml"),
        "resources:\n  - ../deploy\ncomponents:\n  - ../deploy/frr\n",
    )
    .unwrap();
    let routed = render(&site.join("site"));
    let _ = std::fs::remove_dir_all(&site);
    let frr = routed.init_containers.iter().flatten().find(|c| c.name == "frr").expect("the FRR sidecar");
    assert_eq!(
        frr.restart_policy.as_deref(),
        Some("Always"),
        "a native sidecar: it outlives the agent's drain"
    );
    let config = routed.volumes.iter().flatten().find(|v| v.name == "frr-config").unwrap();
    let map = config.config_map.as_ref().unwrap().name.clone();
    assert!(map.starts_with("lb-agent-frr-"), "the generated ConfigMap, by its hashed name: {map}");
    let agent = &routed.containers[0];
    assert_eq!(agent.name, "lb-agent");
    assert!(
        agent
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == "dev-net-tun" && m.mount_path == "/dev/net/tun")
    );
    assert!(
        agent.volume_mounts.iter().flatten().any(|m| m.name == "vrrp-keys"),
        "the patch merges the agent's mounts, it does not replace them"
    );
    let env = |spec: &k8s_openapi::api::core::v1::PodSpec| {
        spec.containers[0].env.iter().flatten().map(|e| e.name.clone()).collect::<Vec<_>>()
    };
    assert!(env(&routed).contains(&"POD_NAME".to_owned()), "rolls keep routes with the sidecar");
    assert!(env(&routed).contains(&"NODE_NAME".to_owned()), "the patch merges the agent's env");
    assert!(!env(&base).contains(&"POD_NAME".to_owned()), "without the sidecar every stop withdraws");
    let caps = agent.security_context.as_ref().unwrap().capabilities.as_ref().unwrap();
    assert!(
        !caps.add.as_ref().unwrap().contains(&"SYS_ADMIN".to_owned()),
        "the agent still has no SYS_ADMIN"
    );
}
