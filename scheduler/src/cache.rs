//! The scheduler's view of the cluster, kept up to date by informer events instead of rebuilt
//! for every pod: each node's info with the pods counted on it, including the pods this
//! scheduler has bound but the informer has not shown bound yet (assumed), so two decisions in a
//! row never both take the last room on a node. Pods and nodes come from the informers' typed
//! views (`rkube_runtime::store`), decoded into k8s-openapi's types once per change.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};

use crate::snapshot::{name, namespace, NodeInfo};

#[derive(Default)]
pub struct Cache {
    pub nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    /// pod key (`namespace/name`) -> the node it is counted on.
    placed: HashMap<String, String>,
    /// Bound pods whose node the cache does not know yet, by node.
    waiting: HashMap<String, Vec<(String, Arc<Pod>)>>,
    /// Where the next search starts.
    pub next_start: usize,
}

fn ns_name(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

impl Cache {
    pub fn is_placed(&self, key: &str) -> bool {
        self.placed.contains_key(key)
    }

    /// A Node object added or changed.
    pub fn set_node(&mut self, node: Arc<Node>) {
        let node_name = name(&node.metadata).to_string();
        match self.index.get(&node_name) {
            Some(&i) => self.nodes[i] = self.nodes[i].with_node(node),
            None => {
                let mut info = NodeInfo::new(node);
                for (_, pod) in self.waiting.remove(&node_name).unwrap_or_default() {
                    info.add_pod(pod);
                }
                self.index.insert(node_name, self.nodes.len());
                self.nodes.push(info);
            }
        }
    }

    pub fn remove_node(&mut self, node_name: &str) {
        let Some(i) = self.index.remove(node_name) else {
            return;
        };
        let gone = self.nodes.swap_remove(i);
        if i < self.nodes.len() {
            self.index.insert(self.nodes[i].name.clone(), i);
        }
        // Its pods stay counted against the name, should the node come back.
        for p in gone.pods {
            let key = format!("{}/{}", namespace(&p), name(&p.metadata));
            self.waiting
                .entry(node_name.to_string())
                .or_default()
                .push((key, p));
        }
    }

    /// Counts pod `key` on `node` (moving it if it was counted elsewhere).
    pub fn place(&mut self, key: &str, node: &str, pod: Arc<Pod>) {
        if self.placed.get(key).map(String::as_str) == Some(node) {
            return;
        }
        self.unplace(key);
        let bound_here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node);
        let pod = if bound_here {
            pod
        } else {
            let mut bound = pod.as_ref().clone();
            bound.spec.get_or_insert_with(PodSpec::default).node_name = Some(node.to_string());
            Arc::new(bound)
        };
        match self.index.get(node) {
            Some(&i) => self.nodes[i].add_pod(pod),
            None => self
                .waiting
                .entry(node.to_string())
                .or_default()
                .push((key.to_string(), pod)),
        }
        self.placed.insert(key.to_string(), node.to_string());
    }

    /// Stops counting pod `key` (deleted, finished, or a binding that failed).
    pub fn unplace(&mut self, key: &str) {
        let Some(node) = self.placed.remove(key) else {
            return;
        };
        let (ns, pod_name) = ns_name(key);
        match self.index.get(&node) {
            Some(&i) => {
                self.nodes[i].remove_pod(ns, pod_name);
            }
            None => {
                if let Some(w) = self.waiting.get_mut(&node) {
                    w.retain(|(k, _)| k != key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use serde_json::json;

    fn node(name: &str) -> Arc<Node> {
        Arc::new(NodeBuilder::new(name).cpu("2").node())
    }

    fn pod(name: &str) -> Arc<Pod> {
        Arc::new(PodBuilder::new(name).cpu("1").build())
    }

    #[test]
    fn pods_are_counted_once_wherever_they_arrive_first() {
        let mut c = Cache::default();
        // A bound pod seen before its node.
        c.place("default/a", "n1", pod("a"));
        c.set_node(node("n1"));
        assert_eq!(c.nodes[0].requested.milli_cpu, 1000);
        // Assumed, then seen bound: still once.
        c.place("default/b", "n1", pod("b"));
        c.place("default/b", "n1", pod("b"));
        assert_eq!(c.nodes[0].requested.milli_cpu, 2000);
        c.unplace("default/a");
        assert_eq!(c.nodes[0].requested.milli_cpu, 1000);
        assert_eq!(c.nodes[0].requested.pods, 1);
        // A node update keeps its pods.
        c.set_node(node("n1"));
        assert_eq!(c.nodes[0].requested.milli_cpu, 1000);
        c.remove_node("n1");
        assert!(c.nodes.is_empty());
        c.set_node(node("n1"));
        assert_eq!(c.nodes[0].requested.milli_cpu, 1000);
    }

    #[test]
    fn objects_are_decoded_once_and_what_is_not_an_object_is_an_error() {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "a", "namespace": "default"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c",
                "resources": {"requests": {"cpu": 1}}}]}}))
            .expect("a pod");
        assert_eq!(crate::snapshot::pod_requests(&pod).milli_cpu, 1000);
        let mut c = Cache::default();
        c.set_node(node("n1"));
        c.place("default/a", "n1", Arc::new(pod));
        assert_eq!(c.nodes[0].requested.milli_cpu, 1000);
        assert!(
            serde_json::from_value::<Pod>(json!({"metadata": {"labels": {"app": 1}}})).is_err()
        );
        assert!(serde_json::from_value::<Node>(json!("node")).is_err());
    }
}
