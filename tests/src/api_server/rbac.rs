//! RBAC as kube-apiserver's authorizer applies it, from the manifests the DaemonSet ships
//! (`deploy/rbac.yaml`): a ClusterRole bound by a ClusterRoleBinding grants everywhere, a Role
//! bound by a RoleBinding in its own namespace only. A request no rule allows is refused 403.

use serde_json::Value;

/// What a request asks to do, in RBAC's terms.
#[derive(Clone, Debug)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    /// `services`, or `services/status` for a subresource.
    pub resource: String,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
}

#[derive(Clone, Debug)]
struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    names: Vec<String>,
}

impl Rule {
    fn allows(&self, a: &Attributes) -> bool {
        let any = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        any(&self.groups, a.group)
            && any(&self.resources, &a.resource)
            && any(&self.verbs, a.verb)
            && (self.names.is_empty() || a.name.is_some_and(|n| self.names.iter().any(|x| x == n)))
    }
}

/// The rules granted to one user.
#[derive(Clone, Debug, Default)]
pub struct Authorizer {
    /// (the namespace a Role binds in, or None for cluster-wide; its rules)
    grants: Vec<(Option<String>, Vec<Rule>)>,
}

impl Authorizer {
    /// The grants `user` (e.g. `system:serviceaccount:lb-agent:lb-agent`) gets from the
    /// manifests in `yaml` (several documents).
    pub fn for_user(yaml: &str, user: &str) -> Result<Authorizer, String> {
        let docs: Vec<Value> = serde_yaml::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).map_err(|e| format!("the RBAC manifests: {e}")))
            .collect::<Result<_, _>>()?;
        let rules_of = |kind: &str, name: &str, namespace: Option<&str>| -> Vec<Rule> {
            docs.iter()
                .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
                .filter(|d| namespace.is_none() || d["metadata"]["namespace"].as_str() == namespace)
                .flat_map(|d| d["rules"].as_array().cloned().unwrap_or_default())
                .map(|r| {
                    let strings = |k: &str| -> Vec<String> {
                        r[k].as_array()
                            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
                            .unwrap_or_default()
                    };
                    Rule {
                        groups: strings("apiGroups"),
                        resources: strings("resources"),
                        verbs: strings("verbs"),
                        names: strings("resourceNames"),
                    }
                })
                .collect()
        };
        let is_subject = |d: &Value, binding_namespace: Option<&str>| {
            d["subjects"].as_array().into_iter().flatten().any(|s| match s["kind"].as_str() {
                Some("ServiceAccount") => {
                    let namespace = s["namespace"].as_str().or(binding_namespace).unwrap_or_default();
                    user == format!(
                        "system:serviceaccount:{namespace}:{}",
                        s["name"].as_str().unwrap_or_default()
                    )
                }
                Some("User") => s["name"].as_str() == Some(user),
                _ => false,
            })
        };
        let mut grants = Vec::new();
        for d in &docs {
            match d["kind"].as_str() {
                Some("ClusterRoleBinding") if is_subject(d, None) => {
                    grants.push((
                        None,
                        rules_of("ClusterRole", d["roleRef"]["name"].as_str().unwrap_or_default(), None),
                    ));
                }
                Some("RoleBinding") => {
                    let namespace = d["metadata"]["namespace"].as_str().unwrap_or("default");
                    if !is_subject(d, Some(namespace)) {
                        continue;
                    }
                    let role = d["roleRef"]["name"].as_str().unwrap_or_default();
                    let rules = match d["roleRef"]["kind"].as_str() {
                        Some("ClusterRole") => rules_of("ClusterRole", role, None),
                        _ => rules_of("Role", role, Some(namespace)),
                    };
                    grants.push((Some(namespace.to_owned()), rules));
                }
                _ => {}
            }
        }
        if grants.is_empty() {
            return Err(format!("no binding in the RBAC manifests names {user}"));
        }
        Ok(Authorizer { grants })
    }

    pub fn allows(&self, a: &Attributes) -> bool {
        self.grants.iter().any(|(namespace, rules)| {
            let in_scope = match namespace {
                None => true,
                Some(ns) => a.namespace == Some(ns.as_str()),
            };
            in_scope && rules.iter().any(|r| r.allows(a))
        })
    }
}
