//! The Services' ports with their ready endpoints: what the proxy programs, read from the
//! API's objects.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use rkube_core::meta;

/// The label that names an EndpointSlice's Service.
const SERVICE_NAME: &str = "kubernetes.io/service-name";

/// How long a client sticks to its endpoint with sessionAffinity ClientIP (Kubernetes' default).
const DEFAULT_AFFINITY_SECONDS: i64 = 10800;

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
    services: &HashMap<String, Service>,
    slices: &HashMap<String, EndpointSlice>,
    node: &str,
) -> Vec<ServicePort> {
    // EndpointSlices by their Service (namespace/name).
    let mut by_service: HashMap<String, Vec<&EndpointSlice>> = HashMap::new();
    for slice in slices.values() {
        let svc = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME))
            .map(String::as_str)
            .unwrap_or("");
        if !svc.is_empty() {
            let key = format!("{}/{svc}", meta::namespace(&slice.metadata));
            by_service.entry(key).or_default().push(slice);
        }
    }
    let mut out = Vec::new();
    for svc in services.values() {
        let ns = meta::namespace(&svc.metadata);
        let name = meta::name(&svc.metadata);
        let Some(spec) = &svc.spec else { continue };
        let ty = spec.type_.as_deref().unwrap_or("");
        let cluster_ip = spec.cluster_ip.as_deref().unwrap_or("");
        // Headless and ExternalName Services have no virtual address to program.
        if ty == "ExternalName" || cluster_ip.is_empty() || cluster_ip == "None" {
            continue;
        }
        let mut cluster_ips = spec.cluster_ips.clone().unwrap_or_default();
        if cluster_ips.is_empty() {
            cluster_ips.push(cluster_ip.to_string());
        }
        cluster_ips.retain(|ip| !ip.contains(':')); // IPv4 rules only
        let mut external_ips = spec.external_ips.clone().unwrap_or_default();
        let lb_ips: Vec<String> = svc
            .status
            .iter()
            .filter_map(|st| st.load_balancer.as_ref())
            .flat_map(|lb| lb.ingress.iter().flatten())
            .map(|i| i.ip.clone().unwrap_or_default())
            .filter(|ip| !ip.is_empty() && !ip.contains(':'))
            .collect();
        external_ips.extend(lb_ips.iter().cloned());
        let local_only = spec.external_traffic_policy.as_deref() == Some("Local");
        let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .map_or(DEFAULT_AFFINITY_SECONDS, i64::from)
        });
        let slices = by_service.get(&format!("{ns}/{name}"));
        for p in spec.ports.iter().flatten() {
            let port_name = p.name.as_deref().unwrap_or("");
            let protocol = match p.protocol.as_deref().unwrap_or("") {
                "" => "TCP",
                x => x,
            };
            let mut endpoints = Vec::new();
            let mut endpoint_nodes = Vec::new();
            for slice in slices.into_iter().flatten() {
                if slice.address_type != "IPv4" {
                    continue;
                }
                let Some(target) = slice
                    .ports
                    .iter()
                    .flatten()
                    .find(|sp| {
                        let sp_protocol = sp.protocol.as_deref().unwrap_or("");
                        sp.name.as_deref().unwrap_or("") == port_name
                            && (sp_protocol == protocol || sp_protocol.is_empty())
                    })
                    .and_then(|sp| sp.port)
                else {
                    continue;
                };
                for ep in &slice.endpoints {
                    // Ready is true when unset, as the API defines it.
                    if ep.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                        continue;
                    }
                    let ep_node = ep.node_name.as_deref().unwrap_or("");
                    if let Some(addr) = ep.addresses.first() {
                        endpoints.push((addr.clone(), i64::from(target), ep_node == node));
                        endpoint_nodes.push(ep_node.to_string());
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
                port: i64::from(p.port),
                node_port: i64::from(p.node_port.unwrap_or(0)),
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
