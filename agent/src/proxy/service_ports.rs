//! The Services' ports with their ready endpoints: what the proxy programs, read from the
//! API's objects.

use std::collections::HashMap;

use rkube_core::json::str_at as s;
use serde_json::Value;

/// How long a client sticks to its endpoint with sessionAffinity ClientIP (Kubernetes' default).
const DEFAULT_AFFINITY_SECONDS: i64 = 10800;

/// The strings of an array field (absent: none).
fn strings(v: &Value, p: &str) -> Vec<String> {
    v.pointer(p)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// One port of one Service, as the proxy programs it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ServicePort {
    /// `namespace/name:port-name`.
    pub(super) id: String,
    pub(super) protocol: String,
    pub(super) port: i64,
    pub(super) node_port: i64,
    pub(super) cluster_ips: Vec<String>,
    pub(super) external_ips: Vec<String>,
    /// The load-balancer addresses among them (announced by one node).
    pub(super) lb_ips: Vec<String>,
    /// The nodes of the ready endpoints, sorted.
    pub(super) endpoint_nodes: Vec<String>,
    pub(super) local_only: bool,
    pub(super) affinity: Option<i64>,
    /// Ready endpoints: (address, port, on this node).
    pub(super) endpoints: Vec<(String, i64, bool)>,
}

/// The Services' ports with their ready endpoints, from the objects as the API has them.
pub(super) fn service_ports(
    services: &HashMap<String, Value>,
    slices: &HashMap<String, Value>,
    node: &str,
) -> Vec<ServicePort> {
    // EndpointSlices by their Service (namespace/name).
    let mut by_service: HashMap<String, Vec<&Value>> = HashMap::new();
    for slice in slices.values() {
        let svc = s(slice, "/metadata/labels/kubernetes.io~1service-name");
        if !svc.is_empty() {
            let key = format!("{}/{svc}", s(slice, "/metadata/namespace"));
            by_service.entry(key).or_default().push(slice);
        }
    }
    let mut out = Vec::new();
    for svc in services.values() {
        let ns = s(svc, "/metadata/namespace");
        let name = s(svc, "/metadata/name");
        let ty = s(svc, "/spec/type");
        let cluster_ip = s(svc, "/spec/clusterIP");
        // Headless and ExternalName Services have no virtual address to program.
        if ty == "ExternalName" || cluster_ip.is_empty() || cluster_ip == "None" {
            continue;
        }
        let mut cluster_ips = strings(svc, "/spec/clusterIPs");
        if cluster_ips.is_empty() {
            cluster_ips.push(cluster_ip.to_string());
        }
        cluster_ips.retain(|ip| !ip.contains(':')); // IPv4 rules only
        let mut external_ips = strings(svc, "/spec/externalIPs");
        let lb_ips: Vec<String> = svc
            .pointer("/status/loadBalancer/ingress")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|i| s(i, "/ip").to_string())
                    .filter(|ip| !ip.is_empty() && !ip.contains(':'))
                    .collect()
            })
            .unwrap_or_default();
        external_ips.extend(lb_ips.iter().cloned());
        let local_only = s(svc, "/spec/externalTrafficPolicy") == "Local";
        let affinity = (s(svc, "/spec/sessionAffinity") == "ClientIP").then(|| {
            svc.pointer("/spec/sessionAffinityConfig/clientIP/timeoutSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(DEFAULT_AFFINITY_SECONDS)
        });
        let slices = by_service.get(&format!("{ns}/{name}"));
        for p in svc
            .pointer("/spec/ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let port_name = s(p, "/name");
            let protocol = match s(p, "/protocol") {
                "" => "TCP",
                x => x,
            };
            let mut endpoints = Vec::new();
            let mut endpoint_nodes = Vec::new();
            for slice in slices.into_iter().flatten() {
                if s(slice, "/addressType") != "IPv4" {
                    continue;
                }
                let Some(target) = slice
                    .pointer("/ports")
                    .and_then(Value::as_array)
                    .and_then(|ps| {
                        ps.iter().find(|sp| {
                            s(sp, "/name") == port_name
                                && (s(sp, "/protocol") == protocol || s(sp, "/protocol").is_empty())
                        })
                    })
                    .and_then(|sp| sp.get("port").and_then(Value::as_i64))
                else {
                    continue;
                };
                for ep in slice
                    .pointer("/endpoints")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    // Ready is true when unset, as the API defines it.
                    if ep.pointer("/conditions/ready") == Some(&Value::Bool(false)) {
                        continue;
                    }
                    let local = s(ep, "/nodeName") == node;
                    if let Some(addr) = ep.pointer("/addresses/0").and_then(Value::as_str) {
                        endpoints.push((addr.to_string(), target, local));
                        endpoint_nodes.push(s(ep, "/nodeName").to_string());
                    }
                }
            }
            endpoints.sort();
            endpoints.dedup();
            endpoint_nodes.sort();
            endpoint_nodes.dedup();
            endpoint_nodes.retain(|n| !n.is_empty());
            out.push(ServicePort {
                id: format!("{ns}/{name}:{port_name}"),
                protocol: protocol.to_string(),
                port: p.get("port").and_then(Value::as_i64).unwrap_or(0),
                node_port: p.get("nodePort").and_then(Value::as_i64).unwrap_or(0),
                cluster_ips: cluster_ips.clone(),
                external_ips: external_ips.clone(),
                lb_ips: lb_ips.clone(),
                endpoint_nodes,
                local_only,
                affinity,
                endpoints,
            });
        }
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::testing::objects;

    #[test]
    fn ready_endpoints_behind_each_service_port() {
        let (services, slices) = objects();
        let ports = service_ports(&services, &slices, "a");
        assert_eq!(
            ports.len(),
            2,
            "the headless Service has no virtual address"
        );
        let web = ports.iter().find(|p| p.id == "default/web:http").unwrap();
        assert_eq!(
            web.endpoints,
            vec![
                ("10.244.1.5".into(), 8080, true),
                ("10.244.2.7".into(), 8080, false)
            ]
        );
        assert_eq!(web.node_port, 30008);
        let nobody = ports.iter().find(|p| p.id == "default/nobody:").unwrap();
        assert!(nobody.endpoints.is_empty());
    }
}
