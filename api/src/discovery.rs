//! Discovery documents: the legacy ones (/api, /apis, /api/v1, /apis/<group>[/<version>]) and
//! the aggregated ones (apidiscovery.k8s.io/v2 and v2beta1) that kubectl asks for first.

use serde_json::{json, Value};

use crate::resources::{group_versions, Resource, RESOURCES};

/// Kind, group and version a subresource answers with, and its verbs.
fn subresource(
    r: &Resource,
    sub: &str,
) -> (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
) {
    const GPU: &[&str] = &["get", "patch", "update"];
    match sub {
        "scale" => ("Scale", "autoscaling", "v1", GPU),
        "binding" => ("Binding", "", "v1", &["create"]),
        "eviction" => ("Eviction", "policy", "v1", &["create"]),
        "token" => ("TokenRequest", "authentication.k8s.io", "v1", &["create"]),
        "finalize" => (r.kind, r.group, r.version, &["update"]),
        _ => (r.kind, r.group, r.version, GPU),
    }
}

fn in_group<'a>(group: &'a str, version: &'a str) -> impl Iterator<Item = &'static Resource> + 'a {
    RESOURCES
        .iter()
        .filter(move |r| r.group == group && r.version == version)
}

/// `/api`: the core group's versions.
pub fn api_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn api_group(name: &str, versions: &[&str]) -> Value {
    let gvs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    // In the order of Go's APIGroup: the versions before the preferred one.
    let preferred = gvs.first().cloned().unwrap_or(Value::Null);
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": name,
        "versions": gvs,
        "preferredVersion": preferred,
    })
}

/// `/apis`: every named group.
pub fn api_group_list() -> Value {
    let groups: Vec<Value> = group_versions()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, v)| {
            let mut group = api_group(g, &v);
            if let Some(o) = group.as_object_mut() {
                o.shift_remove("kind");
                o.shift_remove("apiVersion");
            }
            group
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/<group>`.
pub fn group(name: &str) -> Option<Value> {
    group_versions()
        .into_iter()
        .find(|(g, _)| *g == name && !g.is_empty())
        .map(|(g, v)| api_group(g, &v))
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in in_group(group, version) {
        let mut entry = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        resources.push(entry);
        for sub in r.subresources {
            let (kind, g, v, verbs) = subresource(r, sub);
            // In the order of Go's APIResource: a subresource of another group names it
            // before its kind.
            let mut entry = json!({
                "name": format!("{}/{sub}", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
            });
            if (g, v) != (r.group, r.version) {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            entry["kind"] = json!(kind);
            entry["verbs"] = json!(verbs);
            resources.push(entry);
        }
    }
    if resources.is_empty() {
        return None;
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }))
}

fn aggregated_version(group: &str, version: &str) -> Value {
    let resources: Vec<Value> = in_group(group, version)
        .map(|r| {
            let subresources: Vec<Value> = r
                .subresources
                .iter()
                .map(|sub| {
                    let (kind, g, v, verbs) = subresource(r, sub);
                    json!({
                        "subresource": sub,
                        "responseKind": {"group": g, "version": v, "kind": kind},
                        "verbs": verbs,
                    })
                })
                .collect();
            let mut entry = json!({
                "resource": r.plural,
                "responseKind": {"group": r.group, "version": r.version, "kind": r.kind},
                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                "singularResource": r.singular,
                "verbs": r.verbs,
            });
            if !r.short_names.is_empty() {
                entry["shortNames"] = json!(r.short_names);
            }
            if !r.categories.is_empty() {
                entry["categories"] = json!(r.categories);
            }
            if !subresources.is_empty() {
                entry["subresources"] = Value::Array(subresources);
            }
            entry
        })
        .collect();
    json!({"version": version, "resources": resources, "freshness": "Current"})
}

fn aggregated_group(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| aggregated_version(group, v))
        .collect();
    json!({"metadata": {"name": group}, "versions": versions})
}

/// The aggregated document for `/api` (`legacy`) or `/apis`, in discovery `version` (v2 or
/// v2beta1: the same shape).
pub fn aggregated(legacy: bool, version: &str) -> Value {
    let items: Vec<Value> = group_versions()
        .into_iter()
        .filter(|(g, _)| g.is_empty() == legacy)
        .map(|(g, v)| aggregated_group(g, &v))
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList",
        "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {},
        "items": items,
    })
}

/// Which aggregated discovery version the Accept header asks for, if any.
pub fn wants_aggregated(accept: &str) -> Option<&'static str> {
    for part in accept.split(',') {
        if part.contains("as=APIGroupDiscoveryList") && part.contains("g=apidiscovery.k8s.io") {
            if part.contains("v=v2beta1") {
                return Some("v2beta1");
            }
            if part.contains("v=v2") {
                return Some("v2");
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregated_accept_header() {
        let kubectl = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";
        assert_eq!(wants_aggregated(kubectl), Some("v2"));
        assert_eq!(wants_aggregated("application/json"), None);
    }

    #[test]
    fn core_list_has_subresources() {
        let list = resource_list("", "v1").unwrap();
        let names: Vec<&str> = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"pods"));
        assert!(names.contains(&"pods/status"));
        assert!(names.contains(&"replicationcontrollers/scale"));
        let cs = list["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "componentstatuses")
            .unwrap();
        assert_eq!(cs["verbs"], json!(["get", "list"]));
        assert_eq!(cs["shortNames"], json!(["cs"]));
        let networking = resource_list("networking.k8s.io", "v1").unwrap();
        let names: Vec<&str> = networking["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "ingresses",
                "ingresses/status",
                "ingressclasses",
                "networkpolicies"
            ]
        );
        assert!(resource_list("apps", "v2").is_none());
        let apis = aggregated(false, "v2");
        assert!(apis["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["metadata"]["name"] == "apps"));
    }

    fn keys(v: &Value) -> Vec<&str> {
        v.as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Discovery documents are Go structs too: APIGroup lists its versions before the
    /// preferred one, and an APIResource its group and version before its kind.
    #[test]
    fn discovery_documents_are_in_go_order() {
        let apps = group("apps").unwrap();
        assert_eq!(
            keys(&apps),
            ["kind", "apiVersion", "name", "versions", "preferredVersion"]
        );
        let list = api_group_list();
        assert_eq!(
            keys(&list["groups"][0]),
            ["name", "versions", "preferredVersion"]
        );
        let apps = resource_list("apps", "v1").unwrap();
        let scale = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments/scale")
            .unwrap();
        assert_eq!(
            keys(scale),
            [
                "name",
                "singularName",
                "namespaced",
                "group",
                "version",
                "kind",
                "verbs"
            ]
        );
    }
}
