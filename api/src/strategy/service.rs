//! Services: defaults by type, port validation, a DNS label name, and the addresses they hold
//! (a cluster IP and node ports, picked by [`crate::services`] and claimed under their own
//! store keys in the transaction that writes the Service).

use serde_json::{json, Value};

use crate::admission::{check_label, child, default, each_in, invalid, required};
use crate::error::{ApiError, Cause};
use crate::handler::Api;
use crate::services::{self, ServiceNet};
use crate::storage::Freshness;

use super::{immutable, Hook, Strategy};

pub struct Service;

impl Strategy for Service {
    /// A Service's name is a DNS label (it becomes one in the cluster's DNS).
    fn check_name(&self, name: &str) -> Option<String> {
        check_label(name)
    }

    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "type", json!("ClusterIP"));
        default(spec, "sessionAffinity", json!("None"));
        let ty = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if ty != "ExternalName" {
            default(spec, "internalTrafficPolicy", json!("Cluster"));
            default(spec, "ipFamilies", json!(["IPv4"]));
            default(spec, "ipFamilyPolicy", json!("SingleStack"));
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            default(spec, "externalTrafficPolicy", json!("Cluster"));
        }
        if ty == "LoadBalancer" {
            default(spec, "allocateLoadBalancerNodePorts", json!(true));
        }
        for p in each_in(spec, "ports") {
            default(p, "protocol", json!("TCP"));
            if let Some(port) = p.get("port").cloned() {
                default(p, "targetPort", port);
            }
        }
        let status = child(o, "status");
        default(status, "loadBalancer", json!({}));
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        let ty = spec
            .and_then(|s| s.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP");
        if !["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"].contains(&ty) {
            causes.push(Cause {
                reason: "FieldValueNotSupported",
                field: "spec.type".into(),
                message: format!("Unsupported value: {ty:?}: supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\""),
            });
        }
        let ports = spec.and_then(|s| s.get("ports")).and_then(Value::as_array);
        let headless = spec
            .and_then(|s| s.get("clusterIP"))
            .and_then(Value::as_str)
            == Some("None");
        if ty != "ExternalName" && !headless && ports.is_none_or(|p| p.is_empty()) {
            causes.push(required("spec.ports"));
        }
        for (i, p) in ports.into_iter().flatten().enumerate() {
            match p.get("port").and_then(Value::as_i64) {
                Some(n) if (1..=65535).contains(&n) => {}
                Some(n) => causes.push(invalid(
                    &format!("spec.ports[{i}].port"),
                    format!("Invalid value: {n}: must be between 1 and 65535, inclusive"),
                )),
                None => causes.push(required(&format!("spec.ports[{i}].port"))),
            }
            if ports.is_some_and(|all| all.len() > 1)
                && p.get("name")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                causes.push(required(&format!("spec.ports[{i}].name")));
            }
        }
    }

    fn prepare_for_update(&self, current: &Value, new: &mut Value) {
        services::keep_allocated(current, new);
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/spec/clusterIP", current, new, causes);
    }

    fn allocate(&self, net: &ServiceNet, object: &mut Value) -> Result<(), ApiError> {
        services::allocate(net, object)
    }

    fn claims(&self, object: &Value) -> Vec<String> {
        services::claims(object)
    }

    /// A 422 when one of the addresses `svc` asks for (and `old` did not hold) is taken.
    fn check_claims<'a>(
        &'a self,
        api: &'a Api,
        svc: &'a Value,
        old: Option<&'a Value>,
    ) -> Hook<'a> {
        Box::pin(async move {
            let held = old.map(services::claims).unwrap_or_default();
            for claim in services::claims(svc) {
                if held.contains(&claim) {
                    continue;
                }
                if api.store.get(&claim, Freshness::Latest).await?.is_some() {
                    return Err(services::taken(svc, &claim));
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_type() {
        // (type, field that must be defaulted, field that must stay absent)
        let cases = [
            (
                "ClusterIP",
                "internalTrafficPolicy",
                "externalTrafficPolicy",
            ),
            (
                "NodePort",
                "externalTrafficPolicy",
                "allocateLoadBalancerNodePorts",
            ),
            ("LoadBalancer", "allocateLoadBalancerNodePorts", "none"),
            ("ExternalName", "sessionAffinity", "ipFamilies"),
        ];
        for (ty, set, absent) in cases {
            let mut svc = json!({"spec": {"type": ty, "ports": [{"port": 80}]}});
            Service.defaults(&mut svc);
            assert!(svc["spec"].get(set).is_some(), "{ty}: {set}");
            assert!(svc["spec"].get(absent).is_none(), "{ty}: {absent}");
            assert_eq!(svc["spec"]["ports"][0]["targetPort"], 80);
        }
    }

    #[test]
    fn cluster_ip_may_not_change_but_is_kept() {
        let old = json!({"spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"]}});
        let mut new = json!({"spec": {}});
        Service.prepare_for_update(&old, &mut new);
        assert_eq!(new["spec"]["clusterIP"], "10.96.0.10");
        let mut causes = Vec::new();
        Service.validate_update(&old, &new, &mut causes);
        assert!(causes.is_empty());
        Service.validate_update(
            &old,
            &json!({"spec": {"clusterIP": "10.96.0.11"}}),
            &mut causes,
        );
        assert_eq!(causes[0].field, "spec.clusterIP");
    }

    #[test]
    fn ports_and_names() {
        let mut causes = Vec::new();
        Service.validate(
            &json!({"spec": {"ports": [{"port": 0}, {"port": 80}]}}),
            &mut causes,
        );
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.ports[0].port",
                "spec.ports[0].name",
                "spec.ports[1].name"
            ]
        );
        assert!(Service.check_name("a.b").is_some());
        assert!(Service.check_name("web").is_none());
    }
}
