//! The scheduler's view of the cluster, kept up to date by informer events instead of rebuilt
//! for every pod: each node's info with the pods counted on it, including the pods this
//! scheduler has bound but the informer has not shown bound yet (assumed), so two decisions in a
//! row never both take the last room on a node.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::snapshot::NodeInfo;

#[derive(Default)]
pub struct Cache {
    pub nodes: Vec<NodeInfo>,
    index: HashMap<String, usize>,
    /// pod key (`namespace/name`) -> the node it is counted on.
    placed: HashMap<String, String>,
    /// Bound pods whose node the cache does not know yet, by node.
    waiting: HashMap<String, Vec<(String, Arc<Value>)>>,
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
    pub fn set_node(&mut self, node: Arc<Value>) {
        let name = crate::snapshot::at(&node, &["metadata", "name"])
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        match self.index.get(&name) {
            Some(&i) => self.nodes[i] = self.nodes[i].with_node(node),
            None => {
                let mut info = NodeInfo::new(node);
                for (_, pod) in self.waiting.remove(&name).unwrap_or_default() {
                    info.add_pod(pod);
                }
                self.index.insert(name, self.nodes.len());
                self.nodes.push(info);
            }
        }
    }

    pub fn remove_node(&mut self, name: &str) {
        let Some(i) = self.index.remove(name) else {
            return;
        };
        let gone = self.nodes.swap_remove(i);
        if i < self.nodes.len() {
            self.index.insert(self.nodes[i].name.clone(), i);
        }
        // Its pods stay counted against the name, should the node come back.
        for p in gone.pods {
            let key = format!(
                "{}/{}",
                crate::snapshot::at(&p, &["metadata", "namespace"])
                    .and_then(Value::as_str)
                    .unwrap_or(""),
                crate::snapshot::at(&p, &["metadata", "name"])
                    .and_then(Value::as_str)
                    .unwrap_or("")
            );
            self.waiting
                .entry(name.to_string())
                .or_default()
                .push((key, p));
        }
    }

    /// Counts pod `key` on `node` (moving it if it was counted elsewhere).
    pub fn place(&mut self, key: &str, node: &str, pod: Arc<Value>) {
        if self.placed.get(key).map(String::as_str) == Some(node) {
            return;
        }
        self.unplace(key);
        let pod = if crate::snapshot::at(&pod, &["spec", "nodeName"]).and_then(Value::as_str)
            == Some(node)
        {
            pod
        } else {
            let mut bound = pod.as_ref().clone();
            bound["spec"]["nodeName"] = json!(node);
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
        let (ns, name) = ns_name(key);
        match self.index.get(&node) {
            Some(&i) => {
                self.nodes[i].remove_pod(ns, name);
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

    fn node(name: &str) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name},
                        "status": {"allocatable": {"cpu": "2", "memory": "1Gi", "pods": "10"}}}))
    }

    fn pod(name: &str) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "namespace": "default"},
                        "spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}}))
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
}
