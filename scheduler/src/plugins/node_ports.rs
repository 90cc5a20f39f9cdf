//! NodePorts: a pod's host ports must be free on the node (same protocol and port, on the same
//! host IP or either on all addresses).

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{CycleState, FilterPlugin, Status};
use crate::snapshot::{host_ports, NodeInfo};

pub struct NodePorts;

impl FilterPlugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, _: &CycleState) -> Status {
        let conflict = host_ports(pod).iter().any(|(proto, ip, port)| {
            node.host_ports.iter().any(|(p2, ip2, port2)| {
                proto == p2 && port == port2 && (ip == ip2 || ip == "0.0.0.0" || ip2 == "0.0.0.0")
            })
        });
        if conflict {
            Status::unschedulable("node(s) didn't have free ports for the requested pod ports")
        } else {
            Status::success()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use std::sync::Arc;

    #[test]
    fn a_host_port_is_taken_once_per_node() {
        let mut node = NodeBuilder::new("n").build();
        node.add_pod(Arc::new(PodBuilder::new("a").host_port(8080).build()));
        assert!(!NodePorts
            .filter(
                &PodBuilder::new("b").host_port(8080).build(),
                &node,
                &CycleState::default()
            )
            .is_success());
        assert!(NodePorts
            .filter(
                &PodBuilder::new("c").host_port(9090).build(),
                &node,
                &CycleState::default()
            )
            .is_success());
    }
}
