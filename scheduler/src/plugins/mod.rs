//! The plugins of the default profile, one module each, and the profile with kube-scheduler's
//! default weights.

pub mod image_locality;
pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_basics;
pub mod node_ports;
pub mod node_resources;
pub mod pod_topology_spread;
pub mod taint_toleration;

use crate::framework::Profile;

/// kube-scheduler's default profile, for the plugins implemented here (TaintToleration 3,
/// NodeAffinity 2, PodTopologySpread 2, InterPodAffinity 2, NodeResourcesFit 1,
/// NodeResourcesBalancedAllocation 1, ImageLocality 1).
pub fn default_profile() -> Profile {
    Profile {
        pre_filters: vec![
            Box::new(node_resources::Fit),
            Box::new(image_locality::ImageLocality),
            Box::new(inter_pod_affinity::InterPodAffinity),
            Box::new(pod_topology_spread::PodTopologySpread),
        ],
        filters: vec![
            Box::new(node_basics::NodeUnschedulable),
            Box::new(node_basics::NodeName),
            Box::new(taint_toleration::TaintToleration),
            Box::new(node_affinity::NodeAffinity),
            Box::new(node_ports::NodePorts),
            Box::new(node_resources::Fit),
            Box::new(pod_topology_spread::PodTopologySpread),
            Box::new(inter_pod_affinity::InterPodAffinity),
        ],
        scores: vec![
            (Box::new(taint_toleration::TaintToleration), 3),
            (Box::new(node_affinity::NodeAffinity), 2),
            (Box::new(pod_topology_spread::PodTopologySpread), 2),
            (Box::new(inter_pod_affinity::InterPodAffinity), 2),
            (Box::new(node_resources::Fit), 1),
            (Box::new(node_resources::BalancedAllocation), 1),
            (Box::new(image_locality::ImageLocality), 1),
        ],
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Builders for the plugins' table tests.
    use std::sync::Arc;

    use serde_json::{json, Value};

    use crate::snapshot::NodeInfo;

    pub struct NodeBuilder(Value);

    impl NodeBuilder {
        pub fn new(name: &str) -> Self {
            NodeBuilder(json!({"metadata": {"name": name, "labels": {}},
                               "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
        }
        pub fn label(mut self, k: &str, v: &str) -> Self {
            self.0["metadata"]["labels"][k] = json!(v);
            self
        }
        pub fn cpu(mut self, cpu: &str) -> Self {
            self.0["status"]["allocatable"]["cpu"] = json!(cpu);
            self
        }
        pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
            let t = json!({"key": key, "value": value, "effect": effect});
            match self
                .0
                .pointer_mut("/spec/taints")
                .and_then(Value::as_array_mut)
            {
                Some(ts) => ts.push(t),
                None => self.0["spec"] = json!({"taints": [t]}),
            }
            self
        }
        pub fn unschedulable(mut self) -> Self {
            self.0["spec"]["unschedulable"] = json!(true);
            self
        }
        pub fn build(self) -> NodeInfo {
            NodeInfo::new(Arc::new(self.0))
        }
    }

    pub struct PodBuilder(Value);

    impl PodBuilder {
        pub fn new(name: &str) -> Self {
            PodBuilder(json!({"metadata": {"name": name, "namespace": "default"},
                              "spec": {"containers": [{"name": "c", "image": "i"}]}}))
        }
        pub fn cpu(mut self, cpu: &str) -> Self {
            self.0["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": cpu}});
            self
        }
        pub fn node_selector(mut self, k: &str, v: &str) -> Self {
            self.0["spec"]["nodeSelector"] = json!({k: v});
            self
        }
        pub fn toleration(mut self, t: Value) -> Self {
            self.0["spec"]["tolerations"] = json!([t]);
            self
        }
        pub fn host_port(mut self, port: i64) -> Self {
            self.0["spec"]["containers"][0]["ports"] =
                json!([{"containerPort": port, "hostPort": port}]);
            self
        }
        pub fn affinity(mut self, a: Value) -> Self {
            self.0["spec"]["affinity"] = json!({"nodeAffinity": a});
            self
        }
        pub fn build(self) -> Value {
            self.0
        }
    }
}
