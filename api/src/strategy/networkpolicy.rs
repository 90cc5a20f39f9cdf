//! NetworkPolicies: which traffic the selected pods accept and send. Stored and checked as
//! kube-apiserver does (policy types follow the rules given, ports default to TCP); a network
//! plugin enforces them, and rkube's agent has none.

use serde_json::{json, Value};

use crate::admission::{child, default, each_in};
use crate::error::Cause;

use super::field::{
    cidr_contains, forbidden, invalid, items, label_selector, not_supported, parse_cidr, port_name,
    port_number, required, str_of,
};
use super::Strategy;

pub struct NetworkPolicy;

impl Strategy for NetworkPolicy {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "podSelector", json!({}));
        // A policy that names no types restricts ingress, and egress when it has egress rules.
        let has_types = spec
            .get("policyTypes")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        if !has_types {
            let egress = spec
                .get("egress")
                .and_then(Value::as_array)
                .is_some_and(|e| !e.is_empty());
            let types = if egress {
                json!(["Ingress", "Egress"])
            } else {
                json!(["Ingress"])
            };
            spec.insert("policyTypes".into(), types);
        }
        for direction in ["ingress", "egress"] {
            for rule in each_in(spec, direction) {
                for port in each_in(rule, "ports") {
                    default(port, "protocol", json!("TCP"));
                }
            }
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        label_selector(
            "spec.podSelector",
            spec.and_then(|s| s.get("podSelector")),
            causes,
        );
        for (direction, peers) in [("ingress", "from"), ("egress", "to")] {
            for (i, rule) in items(spec, direction).iter().enumerate() {
                let at = format!("spec.{direction}[{i}]");
                for (j, p) in items(Some(rule), "ports").iter().enumerate() {
                    port(p, &format!("{at}.ports[{j}]"), causes);
                }
                for (j, p) in items(Some(rule), peers).iter().enumerate() {
                    peer(p, &format!("{at}.{peers}[{j}]"), causes);
                }
            }
        }
        let types = items(spec, "policyTypes");
        if types.len() > 2 {
            causes.push(invalid(
                "spec.policyTypes",
                &json!(types),
                "may not specify more than two policyTypes",
            ));
            return;
        }
        for (i, t) in types.iter().enumerate() {
            if !matches!(t.as_str(), Some("Ingress" | "Egress")) {
                causes.push(not_supported(
                    &format!("spec.policyTypes[{i}]"),
                    t,
                    &["Ingress", "Egress"],
                ));
            }
        }
    }
}

/// A rule's port: a protocol Kubernetes knows, a number or a name, and a range's end.
fn port(p: &Value, at: &str, causes: &mut Vec<Cause>) {
    if let Some(proto) = p.get("protocol") {
        if !matches!(proto.as_str(), Some("TCP" | "UDP" | "SCTP")) {
            causes.push(not_supported(
                &format!("{at}.protocol"),
                proto,
                &["TCP", "UDP", "SCTP"],
            ));
        }
    }
    let end = p.get("endPort");
    match p.get("port") {
        Some(Value::String(name)) => {
            if let Some(e) = end {
                causes.push(invalid(
                    &format!("{at}.endPort"),
                    e,
                    "may not be specified when `port` is non-numeric",
                ));
            }
            port_name(&format!("{at}.port"), name, causes);
        }
        Some(n) => {
            port_number(&format!("{at}.port"), n, causes);
            if let Some(e) = end {
                if e.as_i64() < n.as_i64() {
                    causes.push(invalid(
                        &format!("{at}.endPort"),
                        e,
                        "must be greater than or equal to `port`",
                    ));
                }
                port_number(&format!("{at}.endPort"), e, causes);
            }
        }
        None => {
            if let Some(e) = end {
                causes.push(invalid(
                    &format!("{at}.endPort"),
                    e,
                    "may not be specified when `port` is not specified",
                ));
            }
        }
    }
}

/// A peer: pods, namespaces, or an address block (which stands alone).
fn peer(p: &Value, at: &str, causes: &mut Vec<Cause>) {
    let mut kinds = 0;
    for key in ["podSelector", "namespaceSelector"] {
        if let Some(sel) = p.get(key) {
            kinds += 1;
            label_selector(&format!("{at}.{key}"), Some(sel), causes);
        }
    }
    let block = p.get("ipBlock");
    if let Some(b) = block {
        kinds += 1;
        ip_block(b, &format!("{at}.ipBlock"), causes);
    }
    if kinds == 0 {
        causes.push(required(at, "must specify a peer"));
    } else if kinds > 1 && block.is_some() {
        causes.push(forbidden(
            at,
            "may not specify both ipBlock and another peer",
        ));
    }
}

const CIDR_MESSAGE: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

fn ip_block(b: &Value, at: &str, causes: &mut Vec<Cause>) {
    let cidr = str_of(Some(b), "cidr");
    if cidr.is_empty() {
        causes.push(required(&format!("{at}.cidr"), ""));
        return;
    }
    let Some(net) = parse_cidr(cidr) else {
        causes.push(invalid(&format!("{at}.cidr"), &json!(cidr), CIDR_MESSAGE));
        return;
    };
    for (i, e) in items(Some(b), "except").iter().enumerate() {
        let at = format!("{at}.except[{i}]");
        let s = e.as_str().unwrap_or("");
        match parse_cidr(s) {
            None => causes.push(invalid(&at, e, CIDR_MESSAGE)),
            Some(ex) if !cidr_contains(net, ex.0) || net.1 >= ex.1 => {
                causes.push(invalid(&at, e, "must be a strict subset of `cidr`"))
            }
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn policy_types_follow_the_rules_given() {
        // (spec, policyTypes after defaults)
        let cases = [
            (json!({}), json!(["Ingress"])),
            (json!({"ingress": [{}]}), json!(["Ingress"])),
            (json!({"egress": [{}]}), json!(["Ingress", "Egress"])),
            (
                json!({"egress": [{}], "policyTypes": ["Egress"]}),
                json!(["Egress"]),
            ),
        ];
        for (spec, want) in cases {
            let mut p = policy(spec);
            NetworkPolicy.defaults(&mut p);
            assert_eq!(p["spec"]["policyTypes"], want, "{p}");
            assert_eq!(p["spec"]["podSelector"], json!({}));
        }
        let mut p = policy(
            json!({"ingress": [{"ports": [{"port": 80}, {"port": 53, "protocol": "UDP"}]}]}),
        );
        NetworkPolicy.defaults(&mut p);
        assert_eq!(p["spec"]["ingress"][0]["ports"][0]["protocol"], "TCP");
        assert_eq!(p["spec"]["ingress"][0]["ports"][1]["protocol"], "UDP");
    }

    #[test]
    fn ports_peers_and_blocks() {
        // (spec, the (field, message) pairs refused)
        let cases: Vec<(Value, Vec<(&str, &str)>)> = vec![
            (
                json!({"ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                    "ports": [{"port": 80, "endPort": 90}, {"port": "http"}]}]}),
                vec![],
            ),
            (
                json!({"ingress": [{"ports": [{"port": 80, "protocol": "ICMP"}]}]}),
                vec![("spec.ingress[0].ports[0].protocol", "Unsupported value: \"ICMP\": supported values: \"TCP\", \"UDP\", \"SCTP\"")],
            ),
            (
                json!({"ingress": [{"ports": [{"port": 90, "endPort": 80}]}]}),
                vec![("spec.ingress[0].ports[0].endPort", "Invalid value: 80: must be greater than or equal to `port`")],
            ),
            (
                json!({"egress": [{"to": [{}]}]}),
                vec![("spec.egress[0].to[0]", "Required value: must specify a peer")],
            ),
            (
                json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]}]}),
                vec![("spec.egress[0].to[0]", "Forbidden: may not specify both ipBlock and another peer")],
            ),
            (
                json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["192.168.0.0/24"]}}]}]}),
                vec![("spec.egress[0].to[0].ipBlock.except[0]", "Invalid value: \"192.168.0.0/24\": must be a strict subset of `cidr`")],
            ),
            (
                json!({"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0"}}]}]}),
                vec![("spec.egress[0].to[0].ipBlock.cidr", "Invalid value: \"10.0.0.0\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)")],
            ),
            (
                json!({"policyTypes": ["Ingress", "Sideways"]}),
                vec![("spec.policyTypes[1]", "Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"")],
            ),
            (
                json!({"podSelector": {"matchExpressions": [{"key": "app", "operator": "In"}]}}),
                vec![("spec.podSelector.matchExpressions[0].values", "Required value: must be specified when `operator` is 'In' or 'NotIn'")],
            ),
        ];
        for (spec, want) in cases {
            let mut p = policy(spec);
            NetworkPolicy.defaults(&mut p);
            let mut causes = Vec::new();
            NetworkPolicy.validate(&p, &mut causes);
            let got: Vec<(&str, &str)> = causes
                .iter()
                .map(|c| (c.field.as_str(), c.message.as_str()))
                .collect();
            assert_eq!(got, want, "{p}");
        }
    }
}
