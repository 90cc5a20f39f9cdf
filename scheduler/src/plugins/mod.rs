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
pub mod volume_binding;

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
            // Before PodTopologySpread, which reads the node affinity it compiles.
            Box::new(node_affinity::NodeAffinity),
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
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{
        Affinity, Container, ContainerImage, ContainerPort, Node, NodeSpec, NodeStatus, Pod,
        PodAffinity, PodAffinityTerm, PodAntiAffinity, PodSpec, ResourceRequirements, Taint,
        Toleration, TopologySpreadConstraint,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelector, ObjectMeta, OwnerReference,
    };

    use crate::snapshot::NodeInfo;

    fn quantities(list: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
        list.iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    }

    /// `matchLabels` of one label.
    pub fn match_labels(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some([(k.to_string(), v.to_string())].into()),
            ..Default::default()
        }
    }

    /// A required pod (anti-)affinity term: pods labelled `app` on the same host.
    pub fn same_host_as(app: &str) -> PodAffinityTerm {
        PodAffinityTerm {
            label_selector: Some(match_labels("app", app)),
            topology_key: "kubernetes.io/hostname".into(),
            ..Default::default()
        }
    }

    pub struct NodeBuilder(Node);

    impl NodeBuilder {
        pub fn new(name: &str) -> Self {
            NodeBuilder(Node {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    labels: Some(BTreeMap::new()),
                    ..Default::default()
                },
                status: Some(NodeStatus {
                    allocatable: Some(quantities(&[
                        ("cpu", "4"),
                        ("memory", "8Gi"),
                        ("pods", "110"),
                    ])),
                    ..Default::default()
                }),
                ..Default::default()
            })
        }
        pub fn label(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(k.into(), v.into());
            self
        }
        pub fn cpu(mut self, cpu: &str) -> Self {
            self.allocatable()
                .insert("cpu".into(), Quantity(cpu.into()));
            self
        }
        fn allocatable(&mut self) -> &mut BTreeMap<String, Quantity> {
            self.0
                .status
                .get_or_insert_with(NodeStatus::default)
                .allocatable
                .get_or_insert_with(BTreeMap::new)
        }
        fn spec(&mut self) -> &mut NodeSpec {
            self.0.spec.get_or_insert_with(NodeSpec::default)
        }
        pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
            self.spec().taints.get_or_insert_with(Vec::new).push(Taint {
                key: key.into(),
                value: Some(value.into()),
                effect: effect.into(),
                time_added: None,
            });
            self
        }
        pub fn unschedulable(mut self) -> Self {
            self.spec().unschedulable = Some(true);
            self
        }
        pub fn image(mut self, names: &[&str], size_bytes: i64) -> Self {
            let status = self.0.status.get_or_insert_with(NodeStatus::default);
            status
                .images
                .get_or_insert_with(Vec::new)
                .push(ContainerImage {
                    names: Some(names.iter().map(|n| n.to_string()).collect()),
                    size_bytes: Some(size_bytes),
                });
            self
        }
        pub fn node(self) -> Node {
            self.0
        }
        pub fn build(self) -> NodeInfo {
            NodeInfo::new(Arc::new(self.0))
        }
    }

    pub struct PodBuilder(Pod);

    impl PodBuilder {
        pub fn new(name: &str) -> Self {
            PodBuilder(Pod {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec {
                    containers: vec![Container {
                        name: "c".into(),
                        image: Some("i".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            })
        }
        fn spec(&mut self) -> &mut PodSpec {
            self.0.spec.get_or_insert_with(PodSpec::default)
        }
        fn container(&mut self) -> &mut Container {
            &mut self.spec().containers[0]
        }
        fn affinity(&mut self) -> &mut Affinity {
            self.spec().affinity.get_or_insert_with(Affinity::default)
        }
        pub fn label(mut self, k: &str, v: &str) -> Self {
            self.0
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .insert(k.into(), v.into());
            self
        }
        pub fn owner(mut self, kind: &str, name: &str) -> Self {
            self.0.metadata.owner_references = Some(vec![OwnerReference {
                kind: kind.into(),
                name: name.into(),
                controller: Some(true),
                ..Default::default()
            }]);
            self
        }
        pub fn cpu(self, cpu: &str) -> Self {
            self.requests(&[("cpu", cpu)])
        }
        /// Requests of the first container.
        pub fn requests(mut self, list: &[(&str, &str)]) -> Self {
            self.container().resources = Some(ResourceRequirements {
                requests: Some(quantities(list)),
                ..Default::default()
            });
            self
        }
        /// Another container, with these requests.
        pub fn container_requests(mut self, list: &[(&str, &str)]) -> Self {
            let containers = &mut self.spec().containers;
            containers.push(Container {
                name: format!("c{}", containers.len()),
                resources: Some(ResourceRequirements {
                    requests: Some(quantities(list)),
                    ..Default::default()
                }),
                ..Default::default()
            });
            self
        }
        /// An init container with these requests.
        pub fn init_requests(mut self, list: &[(&str, &str)]) -> Self {
            self.spec()
                .init_containers
                .get_or_insert_with(Vec::new)
                .push(Container {
                    name: "init".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(quantities(list)),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            self
        }
        pub fn image(mut self, image: &str) -> Self {
            self.container().image = Some(image.into());
            self
        }
        pub fn host_port(mut self, port: i32) -> Self {
            self.container().ports = Some(vec![ContainerPort {
                container_port: port,
                host_port: Some(port),
                ..Default::default()
            }]);
            self
        }
        pub fn node_selector(mut self, k: &str, v: &str) -> Self {
            self.spec().node_selector = Some([(k.to_string(), v.to_string())].into());
            self
        }
        /// Tolerates every taint with this key and effect (operator Exists).
        pub fn tolerate(mut self, key: &str, effect: &str) -> Self {
            self.spec().tolerations = Some(vec![Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Default::default()
            }]);
            self
        }
        pub fn node_affinity(mut self, a: k8s_openapi::api::core::v1::NodeAffinity) -> Self {
            self.affinity().node_affinity = Some(a);
            self
        }
        pub fn requires_affinity(mut self, term: PodAffinityTerm) -> Self {
            self.affinity().pod_affinity = Some(PodAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term]),
                ..Default::default()
            });
            self
        }
        pub fn requires_anti_affinity(mut self, term: PodAffinityTerm) -> Self {
            self.affinity().pod_anti_affinity = Some(PodAntiAffinity {
                required_during_scheduling_ignored_during_execution: Some(vec![term]),
                ..Default::default()
            });
            self
        }
        pub fn spread(mut self, c: TopologySpreadConstraint) -> Self {
            self.spec()
                .topology_spread_constraints
                .get_or_insert_with(Vec::new)
                .push(c);
            self
        }
        pub fn priority(mut self, p: i32) -> Self {
            self.spec().priority = Some(p);
            self
        }
        pub fn preemption_policy(mut self, policy: &str) -> Self {
            self.spec().preemption_policy = Some(policy.into());
            self
        }
        pub fn build(self) -> Pod {
            self.0
        }
    }
}
