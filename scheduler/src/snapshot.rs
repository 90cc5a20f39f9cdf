//! What the scheduler sees of the cluster for one decision: every node with the pods bound to
//! it, their summed requests, the host ports in use, against the node's allocatable resources.
//! Nodes and pods are k8s-openapi's types, decoded once when the cache takes them in; what a
//! [`NodeInfo`] keeps beside them is what would otherwise be summed or derived again for every
//! pod (requests, host ports, normalized image names, the pods with affinity terms).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A pod's namespace ("" when absent).
pub fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("")
}

/// A pod's or node's name ("" when absent).
pub fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or("")
}

/// CPU in millicores, memory in bytes, and a pod count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub pods: i64,
}

fn quantity(q: Option<&Quantity>) -> i128 {
    q.and_then(|q| rkube_core::quantity::parse_quantity(&q.0))
        .unwrap_or(0)
}

/// Quantities are bounded (2^50: a petabyte, a trillion cores) so that sums of them never
/// overflow, whatever a pod or node says.
const QUANTITY_BOUND: i128 = 1 << 50;

fn from_list(list: Option<&BTreeMap<String, Quantity>>) -> Resources {
    let get = |name: &str, scale: i128| {
        (quantity(list.and_then(|l| l.get(name))) / scale).clamp(0, QUANTITY_BOUND) as i64
    };
    Resources {
        milli_cpu: get("cpu", 1_000_000),
        memory: get("memory", 1_000_000_000),
        pods: get("pods", 1_000_000_000),
    }
}

/// A pod's requests as Kubernetes counts them: the sum over its containers, or the largest
/// init container's if that is more, plus one pod.
pub fn pod_requests(pod: &Pod) -> Resources {
    let requests = |cs: Option<&Vec<Container>>| -> Vec<Resources> {
        cs.into_iter()
            .flatten()
            .map(|c| from_list(c.resources.as_ref().and_then(|r| r.requests.as_ref())))
            .collect()
    };
    let spec = pod.spec.as_ref();
    let containers = requests(spec.map(|s| &s.containers));
    let inits = requests(spec.and_then(|s| s.init_containers.as_ref()));
    let mut r = Resources {
        milli_cpu: containers.iter().map(|c| c.milli_cpu).sum(),
        memory: containers.iter().map(|c| c.memory).sum(),
        pods: 1,
    };
    for i in inits {
        r.milli_cpu = r.milli_cpu.max(i.milli_cpu);
        r.memory = r.memory.max(i.memory);
    }
    r
}

/// What scoring assumes for a pod without requests (kube-scheduler's non-zero defaults), so
/// empty pods still spread.
pub const DEFAULT_MILLI_CPU: i64 = 100;
pub const DEFAULT_MEMORY: i64 = 200 * 1024 * 1024;

pub fn non_zero(r: Resources) -> Resources {
    Resources {
        milli_cpu: if r.milli_cpu == 0 {
            DEFAULT_MILLI_CPU
        } else {
            r.milli_cpu
        },
        memory: if r.memory == 0 {
            DEFAULT_MEMORY
        } else {
            r.memory
        },
        pods: 1,
    }
}

/// The images a node reports holding, by each of their names, with their sizes.
fn node_images(node: &Node) -> Vec<(String, i64)> {
    node.status
        .as_ref()
        .and_then(|s| s.images.as_ref())
        .into_iter()
        .flatten()
        .flat_map(|img| {
            let size = img.size_bytes.unwrap_or(0);
            img.names
                .iter()
                .flatten()
                .map(move |n| (crate::plugins::image_locality::normalize(n), size))
        })
        .collect()
}

/// One node and what is placed on it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub node: Arc<Node>,
    pub pods: Vec<Arc<Pod>>,
    /// Unique to this NodeInfo's labels (a process-wide counter), so that what is derived
    /// from the labels of a set of nodes can be remembered until one of them changes. A
    /// changed Node is a new NodeInfo.
    label_gen: u64,
    /// The images the node holds: (normalized name, size in bytes).
    pub images: Vec<(String, i64)>,
    pub allocatable: Resources,
    pub requested: Resources,
    /// Requests with kube-scheduler's non-zero defaults for containers that ask for nothing
    /// (what scoring counts).
    pub non_zero_requested: Resources,
    /// (protocol, hostIP, hostPort) in use.
    pub host_ports: HashSet<(String, String, i32)>,
    /// The pods with pod affinity or anti-affinity terms (the only ones whose terms the
    /// InterPodAffinity plugin must read for other pods).
    pub affinity_pods: Vec<Arc<Pod>>,
}

/// Whether a pod has pod affinity or anti-affinity terms.
pub fn has_pod_affinity(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .is_some_and(|a| a.pod_affinity.is_some() || a.pod_anti_affinity.is_some())
}

/// The host ports a pod asks for: (protocol, hostIP, hostPort).
pub fn host_ports(pod: &Pod) -> Vec<(String, String, i32)> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let ip = p.host_ip.as_deref().unwrap_or("0.0.0.0");
            Some((proto.to_string(), ip.to_string(), port))
        })
        .collect()
}

static LABEL_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl NodeInfo {
    pub fn new(node: Arc<Node>) -> NodeInfo {
        let status = node.status.as_ref();
        let allocatable = status
            .and_then(|s| s.allocatable.as_ref())
            .or(status.and_then(|s| s.capacity.as_ref()));
        let mut alloc = from_list(allocatable);
        if allocatable.is_none_or(|a| !a.contains_key("pods")) {
            alloc.pods = 110;
        }
        NodeInfo {
            name: name(&node.metadata).to_string(),
            label_gen: LABEL_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            images: node_images(&node),
            node,
            pods: Vec::new(),
            allocatable: alloc,
            requested: Resources::default(),
            non_zero_requested: Resources::default(),
            host_ports: HashSet::new(),
            affinity_pods: Vec::new(),
        }
    }

    pub fn add_pod(&mut self, pod: Arc<Pod>) {
        let r = pod_requests(&pod);
        self.requested.milli_cpu += r.milli_cpu;
        self.requested.memory += r.memory;
        self.requested.pods += 1;
        let nz = non_zero(r);
        self.non_zero_requested.milli_cpu += nz.milli_cpu;
        self.non_zero_requested.memory += nz.memory;
        self.non_zero_requested.pods += 1;
        self.host_ports.extend(host_ports(&pod));
        if has_pod_affinity(&pod) {
            self.affinity_pods.push(pod.clone());
        }
        self.pods.push(pod);
    }

    /// Takes a pod off the node (by namespace and name); false when it was not there.
    pub fn remove_pod(&mut self, ns: &str, pod_name: &str) -> bool {
        let same = |p: &Arc<Pod>| namespace(p) == ns && name(&p.metadata) == pod_name;
        let Some(i) = self.pods.iter().position(same) else {
            return false;
        };
        let pod = self.pods.swap_remove(i);
        self.affinity_pods.retain(|p| !same(p));
        let r = pod_requests(&pod);
        self.requested.milli_cpu -= r.milli_cpu;
        self.requested.memory -= r.memory;
        self.requested.pods -= 1;
        let nz = non_zero(r);
        self.non_zero_requested.milli_cpu -= nz.milli_cpu;
        self.non_zero_requested.memory -= nz.memory;
        self.non_zero_requested.pods -= 1;
        self.host_ports = self.pods.iter().flat_map(|p| host_ports(p)).collect();
        true
    }

    /// The same pods on a changed Node object.
    pub fn with_node(&self, node: Arc<Node>) -> NodeInfo {
        let mut n = NodeInfo::new(node);
        for p in &self.pods {
            n.add_pod(p.clone());
        }
        n
    }

    pub fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.node.metadata.labels.as_ref()
    }

    /// The value of one of the node's labels.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels()?.get(key).map(String::as_str)
    }

    /// See `label_gen`: equal only for the same NodeInfo (or a clone of it).
    pub fn label_generation(&self) -> u64 {
        self.label_gen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};

    #[test]
    fn absurd_quantities_are_bounded() {
        let pod = PodBuilder::new("p")
            .requests(&[("cpu", "9999999999999"), ("memory", "-5Gi")])
            .build();
        let r = pod_requests(&pod);
        assert_eq!(r.milli_cpu, 1 << 50);
        assert_eq!(r.memory, 0);
        let mut node = NodeBuilder::new("n").build();
        let pod = Arc::new(pod);
        for _ in 0..1000 {
            node.add_pod(pod.clone());
        }
        assert!(node.requested.milli_cpu > 0);
    }

    #[test]
    fn requests_add_containers_and_take_the_largest_init_container() {
        let pod = PodBuilder::new("p")
            .requests(&[("cpu", "250m"), ("memory", "64Mi")])
            .container_requests(&[("cpu", "0.5"), ("memory", "1Gi")])
            .init_requests(&[("cpu", "2")])
            .build();
        let r = pod_requests(&pod);
        assert_eq!(r.milli_cpu, 2000);
        assert_eq!(r.memory, 64 * 1024 * 1024 + 1024 * 1024 * 1024);
        assert_eq!(r.pods, 1);
    }

    #[test]
    fn a_node_without_a_pod_count_takes_110() {
        let bare = NodeInfo::new(Arc::new(Node::default()));
        assert_eq!(bare.allocatable.pods, 110);
        assert_eq!(NodeBuilder::new("n").build().allocatable.pods, 110);
    }
}
