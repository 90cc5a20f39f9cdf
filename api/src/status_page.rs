//! What a member's status page (`rkube_store::server::status_page`) shows of the Kubernetes
//! API: the nodes and their conditions, read from this member's applied state (no quorum
//! read: the page shows what this member knows).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node as KubeNode;
use rkube_store::server::node::Node;
use rkube_store::server::status_page::{NodeCondition, NodeSource, NodeSummary};

use crate::resources;
use crate::storage::{Freshness, ObjectStore};

pub struct Nodes {
    store: ObjectStore,
}

impl Nodes {
    pub fn new(node: Arc<Node>) -> Self {
        Self {
            store: ObjectStore::new(node),
        }
    }

    async fn list(&self) -> Result<Vec<NodeSummary>, String> {
        let nodes = resources::find("", "v1", "nodes").ok_or("nodes are not a served resource")?;
        let prefix = nodes.prefix(None);
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self
            .store
            .range(&prefix, &end, 0, Freshness::Any)
            .await
            .map_err(|e| e.to_string())?;
        let mut out = Vec::with_capacity(kvs.len());
        for kv in &kvs {
            let node: KubeNode = serde_json::from_slice(&kv.value).map_err(|e| {
                format!(
                    "the object at {} is not a Node: {e}",
                    String::from_utf8_lossy(&kv.key)
                )
            })?;
            out.push(summary(node));
        }
        Ok(out)
    }
}

fn summary(node: KubeNode) -> NodeSummary {
    let conditions = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .map(|c| NodeCondition {
            type_: c.type_,
            status: c.status,
            reason: c.reason.unwrap_or_default(),
            message: c.message.unwrap_or_default(),
            // jiff's Display is RFC 3339.
            last_heartbeat_time: c.last_heartbeat_time.map(|t| t.0.to_string()),
        })
        .collect();
    NodeSummary {
        name: node.metadata.name.unwrap_or_default(),
        unschedulable: node.spec.and_then(|s| s.unschedulable).unwrap_or(false),
        conditions,
    }
}

impl NodeSource for Nodes {
    fn nodes(&self) -> Pin<Box<dyn Future<Output = Result<Vec<NodeSummary>, String>> + Send + '_>> {
        Box::pin(self.list())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_reads_as_its_name_and_conditions() {
        let node: KubeNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent1"},
            "spec": {"unschedulable": true},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2024-05-01T11:59:50Z"},
                {"type": "DiskPressure", "status": "False"}
            ]}
        }))
        .expect("a node");
        let s = summary(node);
        assert_eq!(s.name, "agent1");
        assert!(s.unschedulable);
        assert_eq!(
            s.conditions[0],
            NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: "KubeletReady".into(),
                message: "kubelet is posting ready status".into(),
                last_heartbeat_time: Some("2024-05-01T11:59:50Z".into()),
            }
        );
        assert_eq!(s.conditions[1].last_heartbeat_time, None);
    }
}
