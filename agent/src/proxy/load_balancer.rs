//! The load-balancer addresses this node answers for, as MetalLB's layer-2 mode: which ones
//! it should, and which ones it holds.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

use super::iptables::run_tool;
use super::service_ports::ServicePort;

/// The load-balancer addresses this node answers for (as MetalLB's layer-2 mode): each
/// Service's addresses are announced by one node among those running its ready endpoints,
/// picked by a hash of the Service, so every agent reaches the same choice on its own.
pub(super) fn announced_here(ports: &[ServicePort], node: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for sp in ports {
        if sp.lb_ips.is_empty() || sp.endpoint_nodes.is_empty() {
            continue;
        }
        let service = sp.id.split(':').next().unwrap_or(&sp.id);
        let h = Sha256::digest(service.as_bytes());
        let pick = u64::from_be_bytes(h[..8].try_into().expect("8 bytes")) as usize
            % sp.endpoint_nodes.len();
        if sp.endpoint_nodes[pick] == node {
            out.extend(sp.lb_ips.iter().cloned());
        }
    }
    out
}

/// The interface holding the node's address, and the load-balancer addresses the agent put on
/// it (labelled `<interface>:rklb`, so that a restarted agent finds its own).
pub(super) fn lb_interface(node_ip: &str) -> Option<(String, BTreeSet<String>)> {
    let out = run_tool(&["ip", "-o", "-4", "addr", "show"], None).ok()?;
    let dev = out.lines().find_map(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        let i = words.iter().position(|w| *w == "inet")?;
        (words.get(i + 1)?.split('/').next()? == node_ip)
            .then(|| words.get(1).map(|d| d.to_string()))?
    })?;
    let label = format!("{dev}:rklb");
    let ours = out
        .lines()
        .filter(|l| l.contains(&format!(" {label}")))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let i = words.iter().position(|w| *w == "inet")?;
            words.get(i + 1)?.split('/').next().map(str::to_string)
        })
        .collect();
    Some((dev, ours))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::rules::render;
    use crate::proxy::service_ports::service_ports;
    use crate::proxy::testing::objects;
    use serde_json::json;

    #[test]
    fn one_node_with_endpoints_answers_for_a_load_balancer_address() {
        let (mut services, slices) = objects();
        services.get_mut("default/web").unwrap().status = Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "10.200.0.200"}]}}))
                .unwrap(),
        );
        let answering: Vec<&str> = ["a", "b", "c"]
            .into_iter()
            .filter(|n| !announced_here(&service_ports(&services, &slices, n), n).is_empty())
            .collect();
        assert_eq!(answering.len(), 1, "{answering:?}");
        assert_ne!(answering[0], "c", "c runs none of its endpoints");
        let rules = render(&service_ports(&services, &slices, "a"));
        assert!(rules.nat["RKUBE-SERVICES"]
            .iter()
            .any(|r| r.contains("-d 10.200.0.200/32 -p tcp -m tcp --dport 80 -j RKUBE-SVC-")));
    }
}
