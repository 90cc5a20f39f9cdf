//! What the scheduler sees of the cluster for one decision: every node with the pods bound to
//! it, their summed requests, the host ports in use, against the node's allocatable resources.

use std::collections::HashSet;
use std::sync::Arc;

use rkube_core::selector::LabelSelector;
use serde_json::Value;

/// The value at a path of object keys: `Value::pointer` without its token unescaping, which
/// costs more than the lookup on the scheduler's hot paths.
pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, key| cur.get(*key))
}

/// CPU in millicores, memory in bytes, and a pod count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: i64,
    pub memory: i64,
    pub pods: i64,
}

fn quantity(v: Option<&Value>) -> i128 {
    match v {
        Some(Value::String(s)) => rkube_core::quantity::parse_quantity(s).unwrap_or(0),
        Some(Value::Number(n)) => i128::from(n.as_i64().unwrap_or(0)) * 1_000_000_000,
        _ => 0,
    }
}

/// Quantities are bounded (2^50: a petabyte, a trillion cores) so that sums of them never
/// overflow, whatever a pod or node says.
const QUANTITY_BOUND: i128 = 1 << 50;

fn from_list(list: Option<&Value>) -> Resources {
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
pub fn pod_requests(pod: &Value) -> Resources {
    let sum = |field: &str| {
        at(pod, &["spec", field])
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .map(|c| from_list(crate::snapshot::at(c, &["resources", "requests"])))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let containers = sum("containers");
    let inits = sum("initContainers");
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
fn node_images(node: &Value) -> Vec<(String, i64)> {
    at(node, &["status", "images"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|img| {
            let size = img.get("sizeBytes").and_then(Value::as_i64).unwrap_or(0);
            img.get("names")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(move |n| (crate::plugins::image_locality::normalize(n), size))
        })
        .collect()
}

/// A placed pod's namespace and labels, and whether it is being deleted: what selectors ask.
#[derive(Debug, Clone, Default)]
pub struct PodMeta {
    pub namespace: String,
    pub labels: std::collections::BTreeMap<String, String>,
    pub deleting: bool,
}

impl PodMeta {
    pub fn of(pod: &Value) -> PodMeta {
        PodMeta {
            namespace: at(pod, &["metadata", "namespace"])
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            labels: at(pod, &["metadata", "labels"])
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default(),
            deleting: at(pod, &["metadata", "deletionTimestamp"]).is_some(),
        }
    }
}

/// A label selector ready to match many pods: plain `matchLabels` compared directly, anything
/// else parsed once.
pub enum Selector {
    Nothing,
    Labels(Vec<(String, String)>),
    Parsed(LabelSelector),
}

impl Selector {
    pub fn new(selector: Option<&Value>) -> Selector {
        let Some(sel) = selector.filter(|s| !s.is_null()) else {
            return Selector::Nothing;
        };
        let expressions = sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .is_some_and(|e| !e.is_empty());
        match sel.get("matchLabels").and_then(Value::as_object) {
            Some(m) if !expressions => Selector::Labels(
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect(),
            ),
            None if !expressions => Selector::Labels(Vec::new()),
            _ => Selector::Parsed(LabelSelector::from_json(sel)),
        }
    }

    pub fn matches(&self, meta: &PodMeta) -> bool {
        match self {
            Selector::Nothing => false,
            Selector::Labels(want) => want
                .iter()
                .all(|(k, v)| meta.labels.get(k).is_some_and(|got| got == v)),
            Selector::Parsed(sel) => sel.matches_with(|k| meta.labels.get(k).map(String::as_str)),
        }
    }
}

/// One node and what is placed on it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub name: String,
    pub node: Arc<Value>,
    pub pods: Vec<Arc<Value>>,
    /// The node's labels, copied out of the object once (plugins read them for every pod).
    /// Never changed after construction: a changed Node is a new NodeInfo.
    label_map: Option<serde_json::Map<String, Value>>,
    /// Unique to this NodeInfo's labels (a process-wide counter), so that what is derived
    /// from the labels of a set of nodes can be remembered until one of them changes.
    label_gen: u64,
    /// The images the node holds: (normalized name, size in bytes).
    pub images: Vec<(String, i64)>,
    /// What label selectors read of each pod in `pods` (same order), decoded once.
    pub pod_meta: Vec<PodMeta>,
    pub allocatable: Resources,
    pub requested: Resources,
    /// Requests with kube-scheduler's non-zero defaults for containers that ask for nothing
    /// (what scoring counts).
    pub non_zero_requested: Resources,
    /// (protocol, hostIP, hostPort) in use.
    pub host_ports: HashSet<(String, String, i64)>,
    /// The pods with pod affinity or anti-affinity terms (the only ones whose terms the
    /// InterPodAffinity plugin must read for other pods).
    pub affinity_pods: Vec<Arc<Value>>,
}

/// Whether a pod has pod affinity or anti-affinity terms.
pub fn has_pod_affinity(pod: &Value) -> bool {
    crate::snapshot::at(pod, &["spec", "affinity", "podAffinity"]).is_some()
        || crate::snapshot::at(pod, &["spec", "affinity", "podAntiAffinity"]).is_some()
}

/// The host ports a pod asks for: (protocol, hostIP, hostPort).
pub fn host_ports(pod: &Value) -> Vec<(String, String, i64)> {
    crate::snapshot::at(pod, &["spec", "containers"])
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|c| {
            c.get("ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .filter_map(|p| {
            let port = p
                .get("hostPort")
                .and_then(Value::as_i64)
                .filter(|p| *p > 0)?;
            let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            let ip = p.get("hostIP").and_then(Value::as_str).unwrap_or("0.0.0.0");
            Some((proto.to_string(), ip.to_string(), port))
        })
        .collect()
}

static LABEL_GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl NodeInfo {
    pub fn new(node: Arc<Value>) -> NodeInfo {
        let allocatable = crate::snapshot::at(&node, &["status", "allocatable"])
            .or(crate::snapshot::at(&node, &["status", "capacity"]));
        let mut alloc = from_list(allocatable);
        if allocatable.and_then(|a| a.get("pods")).is_none() {
            alloc.pods = 110;
        }
        let label_map = at(&node, &["metadata", "labels"])
            .and_then(Value::as_object)
            .cloned();
        let images = node_images(&node);
        NodeInfo {
            name: crate::snapshot::at(&node, &["metadata", "name"])
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            node,
            label_map,
            label_gen: LABEL_GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            images,
            pods: Vec::new(),
            pod_meta: Vec::new(),
            allocatable: alloc,
            requested: Resources::default(),
            non_zero_requested: Resources::default(),
            host_ports: HashSet::new(),
            affinity_pods: Vec::new(),
        }
    }

    pub fn add_pod(&mut self, pod: Arc<Value>) {
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
        self.pod_meta.push(PodMeta::of(&pod));
        self.pods.push(pod);
    }

    /// Takes a pod off the node (by namespace and name); false when it was not there.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> bool {
        let same = |p: &Arc<Value>| {
            crate::snapshot::at(p, &["metadata", "namespace"]).and_then(Value::as_str)
                == Some(namespace)
                && crate::snapshot::at(p, &["metadata", "name"]).and_then(Value::as_str)
                    == Some(name)
        };
        let Some(i) = self.pods.iter().position(same) else {
            return false;
        };
        let pod = self.pods.swap_remove(i);
        self.pod_meta.swap_remove(i);
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
    pub fn with_node(&self, node: Arc<Value>) -> NodeInfo {
        let mut n = NodeInfo::new(node);
        for p in &self.pods {
            n.add_pod(p.clone());
        }
        n
    }

    pub fn labels(&self) -> Option<&serde_json::Map<String, Value>> {
        self.label_map.as_ref()
    }

    /// See `label_gen`: equal only for the same NodeInfo (or a clone of it).
    pub fn label_generation(&self) -> u64 {
        self.label_gen
    }
}

/// Nodes with the pods bound to them (finished pods hold nothing).
pub fn build(nodes: &[Arc<Value>], pods: &[Arc<Value>]) -> Vec<NodeInfo> {
    let mut infos: Vec<NodeInfo> = nodes.iter().cloned().map(NodeInfo::new).collect();
    for pod in pods {
        let node = crate::snapshot::at(pod, &["spec", "nodeName"])
            .and_then(Value::as_str)
            .unwrap_or("");
        let done = matches!(
            crate::snapshot::at(pod, &["status", "phase"]).and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        if node.is_empty() || done {
            continue;
        }
        if let Some(info) = infos.iter_mut().find(|i| i.name == node) {
            info.add_pod(pod.clone());
        }
    }
    infos
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absurd_quantities_are_bounded() {
        let pod = json!({"spec": {"containers": [
            {"resources": {"requests": {"cpu": "9999999999999", "memory": "-5Gi"}}}]}});
        let r = pod_requests(&pod);
        assert_eq!(r.milli_cpu, 1 << 50);
        assert_eq!(r.memory, 0);
        let mut node = NodeInfo::new(Arc::new(json!({"metadata": {"name": "n"}})));
        for _ in 0..1000 {
            node.add_pod(Arc::new(pod.clone()));
        }
        assert!(node.requested.milli_cpu > 0);
    }

    #[test]
    fn requests_add_containers_and_take_the_largest_init_container() {
        let pod = json!({"spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "250m", "memory": "64Mi"}}},
                {"resources": {"requests": {"cpu": "0.5", "memory": "1Gi"}}}],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}]}});
        let r = pod_requests(&pod);
        assert_eq!(r.milli_cpu, 2000);
        assert_eq!(r.memory, 64 * 1024 * 1024 + 1024 * 1024 * 1024);
        assert_eq!(r.pods, 1);
    }
}
