//! Resource usage of the node and its containers, as the kubelet's Summary API reports it
//! (`GET /stats/summary` on the agent's HTTPS port): for each container its cumulative CPU time
//! (`usageCoreNanoSeconds`, from which a scraper works out a rate) and its memory working set,
//! with the time each was sampled; the node's totals beside them. The Summary's shapes are
//! [`rkube_core::stats`]', which the API server reads them with.
//!
//! On a containerd node the figures are the runtime's (CRI `ListContainerStats`) and the
//! host's (`/proc/stat`, `/proc/meminfo`). A simulated node has no processes, so its usage is
//! modelled: each container of a running pod uses the CPU of the pod's `sim.rkube.io/cpu`
//! annotation (default [`SIM_DEFAULT_CPU`]) and the memory of `sim.rkube.io/memory` (default
//! [`SIM_DEFAULT_MEMORY`]); CPU time accumulates at that rate, and a changed annotation
//! changes the rate from the moment the agent sees it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use anyhow::Result;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Pod;
use rkube_core::meta;
use rkube_core::quantity::{parse_quantity, NANO};
use rkube_core::stats::{
    ContainerStats, CpuStats, MemoryStats, NodeStats, PodReference, PodStats, Summary,
};

use crate::cri::{pb, Cri};

/// The annotation that gives each container of a simulated pod its CPU usage (a quantity).
pub const SIM_CPU: &str = "sim.rkube.io/cpu";
/// The annotation that gives each container of a simulated pod its memory working set.
pub const SIM_MEMORY: &str = "sim.rkube.io/memory";
/// A simulated container's CPU usage when its pod does not say (1 millicore).
pub const SIM_DEFAULT_CPU: &str = "1m";
/// A simulated container's memory working set when its pod does not say.
pub const SIM_DEFAULT_MEMORY: &str = "4Mi";

/// One simulated pod's modelled usage.
struct SimPod {
    node: String,
    namespace: String,
    name: String,
    containers: Vec<String>,
    started: DateTime<Utc>,
    /// Nanocores each container uses now, and its working set in bytes.
    nanocores: u64,
    memory: u64,
    /// CPU time each container used up to `at`.
    used_ns: u128,
    at: Instant,
}

impl SimPod {
    /// CPU time each container has used by `now`.
    fn used_by(&self, now: Instant) -> u128 {
        self.used_ns
            + self.nanocores as u128 * now.duration_since(self.at).as_nanos() / NANO as u128
    }
}

/// The modelled usage of the simulated pods of this process's nodes, by pod uid.
#[derive(Default)]
pub struct SimUsage {
    pods: Mutex<HashMap<String, SimPod>>,
}

fn quantity(pod: &Pod, annotation: &str, default: &str) -> u64 {
    let given = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation))
        .and_then(|q| parse_quantity(q));
    let q = given.or_else(|| parse_quantity(default)).unwrap_or(0);
    u64::try_from(q.max(0)).unwrap_or(u64::MAX)
}

impl SimUsage {
    /// A running simulated pod's newest state: its usage from now on is what its annotations
    /// say.
    pub fn observe(&self, pod: &Pod) {
        let uid = meta::uid(&pod.metadata).to_string();
        let nanocores = quantity(pod, SIM_CPU, SIM_DEFAULT_CPU);
        let memory = quantity(pod, SIM_MEMORY, SIM_DEFAULT_MEMORY) / NANO as u64;
        let now = Instant::now();
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pods.get_mut(&uid) {
            p.used_ns = p.used_by(now);
            p.at = now;
            p.nanocores = nanocores;
            p.memory = memory;
            return;
        }
        let containers = crate::podspec::pod_containers(pod, false)
            .map(|c| c.name.clone())
            .collect();
        pods.insert(
            uid,
            SimPod {
                node: crate::podspec::spec_str(pod, |s| s.node_name.as_ref()).to_string(),
                namespace: meta::namespace(&pod.metadata).to_string(),
                name: meta::name(&pod.metadata).to_string(),
                containers,
                started: Utc::now(),
                nanocores,
                memory,
                used_ns: 0,
                at: now,
            },
        );
    }

    /// The pod's containers stopped.
    pub fn forget(&self, uid: &str) {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// The Summary of `node`'s simulated pods; the node's totals are theirs.
    pub fn summary(&self, node: &str) -> Summary {
        let now = Instant::now();
        let time = rfc3339(Utc::now());
        let pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let (mut node_ns, mut node_mem) = (0u128, 0u64);
        for (uid, p) in pods.iter().filter(|(_, p)| p.node == node) {
            let used = p.used_by(now);
            let started = rfc3339(p.started);
            let containers = p
                .containers
                .iter()
                .map(|c| ContainerStats {
                    name: c.clone(),
                    start_time: Some(started.clone()),
                    cpu: Some(cpu(&time, used)),
                    memory: Some(memory(&time, p.memory)),
                })
                .collect();
            node_ns += used * p.containers.len() as u128;
            node_mem += p.memory * p.containers.len() as u64;
            out.push(PodStats {
                pod_ref: PodReference {
                    name: p.name.clone(),
                    namespace: p.namespace.clone(),
                    uid: uid.clone(),
                },
                start_time: Some(started),
                containers,
            });
        }
        summary(node, &time, node_ns, node_mem, out)
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

fn cpu(time: &str, ns: u128) -> CpuStats {
    CpuStats {
        time: time.to_string(),
        usage_core_nano_seconds: Some(ns as u64),
    }
}

fn memory(time: &str, bytes: u64) -> MemoryStats {
    MemoryStats {
        time: time.to_string(),
        working_set_bytes: Some(bytes),
    }
}

fn summary(node: &str, time: &str, cpu_ns: u128, mem: u64, pods: Vec<PodStats>) -> Summary {
    Summary {
        node: NodeStats {
            node_name: node.to_string(),
            cpu: Some(cpu(time, cpu_ns)),
            memory: Some(memory(time, mem)),
        },
        pods,
    }
}

/// CPU time the host has spent not idle, in nanoseconds (`/proc/stat`'s first line, in
/// USER_HZ ticks of 10 ms).
fn host_cpu_ns() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u128> = line
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: u128 = ticks
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, t)| t)
        .sum();
    Some(busy * 10_000_000)
}

/// The Summary of a containerd node: its containers' stats from the runtime, its totals from
/// the host.
pub async fn cri_summary(cri: &Cri, node: &str) -> Result<Summary> {
    let stats = cri.container_stats().await?;
    let time = rfc3339(Utc::now());
    let mut pods: HashMap<String, (String, String, Vec<ContainerStats>)> = HashMap::new();
    for st in stats {
        let Some(attrs) = &st.attributes else {
            continue;
        };
        let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
        let uid = label(crate::cri::POD_UID);
        if uid.is_empty() {
            continue;
        }
        let name = attrs
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_else(|| label(crate::cri::CONTAINER_NAME));
        let at = |ts: i64| rfc3339(DateTime::from_timestamp_nanos(ts));
        let cpu = st.cpu.as_ref().map(|c: &pb::CpuUsage| CpuStats {
            time: at(c.timestamp),
            usage_core_nano_seconds: c.usage_core_nano_seconds.as_ref().map(|v| v.value),
        });
        let memory = st.memory.as_ref().map(|m: &pb::MemoryUsage| MemoryStats {
            time: at(m.timestamp),
            working_set_bytes: m.working_set_bytes.as_ref().map(|v| v.value),
        });
        let entry = pods.entry(uid).or_insert_with(|| {
            (
                label(crate::cri::POD_NAMESPACE),
                label(crate::cri::POD_NAME),
                Vec::new(),
            )
        });
        entry.2.push(ContainerStats {
            name,
            start_time: None,
            cpu,
            memory,
        });
    }
    let pods = pods
        .into_iter()
        .map(|(uid, (namespace, name, containers))| PodStats {
            pod_ref: PodReference {
                name,
                namespace,
                uid,
            },
            start_time: None,
            containers,
        })
        .collect();
    let mem = match (
        crate::node::meminfo("MemTotal"),
        crate::node::meminfo("MemAvailable"),
    ) {
        (Some(total), Some(avail)) => total.saturating_sub(avail),
        _ => 0,
    };
    Ok(summary(node, &time, host_cpu_ns().unwrap_or(0), mem, pods))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(uid: &str, cpu: Option<&str>) -> Pod {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "default", "name": "web", "uid": uid, "annotations": {}},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
        }))
        .unwrap();
        if let Some(c) = cpu {
            p.metadata
                .annotations
                .get_or_insert_default()
                .insert(SIM_CPU.into(), c.into());
        }
        p
    }

    #[test]
    fn simulated_usage_follows_the_annotation() {
        let usage = SimUsage::default();
        usage.observe(&pod("u1", None));
        {
            let mut pods = usage.pods.lock().unwrap();
            let p = pods.get_mut("u1").unwrap();
            assert_eq!(p.nanocores, 1_000_000);
            assert_eq!(p.memory, 4 << 20);
            // Pretend two seconds went by at 1m.
            p.at -= std::time::Duration::from_secs(2);
        }
        usage.observe(&pod("u1", Some("500m")));
        let p = usage.pods.lock().unwrap();
        let p = p.get("u1").unwrap();
        // The first two seconds count at the old rate (2 ms of CPU), the rate is new.
        assert!((2_000_000..2_100_000).contains(&p.used_ns), "{}", p.used_ns);
        assert_eq!(p.nanocores, 500_000_000);
    }

    #[test]
    fn the_summary_lists_each_container_of_the_node() {
        let usage = SimUsage::default();
        usage.observe(&pod("u1", Some("200m")));
        let mut other = pod("u2", None);
        other.spec.get_or_insert_default().node_name = Some("n2".into());
        usage.observe(&other);
        let sum = serde_json::to_value(usage.summary("n1")).unwrap();
        assert_eq!(sum["node"]["nodeName"], "n1");
        let pods = sum["pods"].as_array().unwrap();
        assert_eq!(pods.len(), 1);
        assert_eq!(pods[0]["podRef"]["uid"], "u1");
        assert_eq!(pods[0]["containers"].as_array().unwrap().len(), 2);
        assert_eq!(
            pods[0]["containers"][1]["memory"]["workingSetBytes"],
            4 << 20
        );
        assert_eq!(sum["node"]["memory"]["workingSetBytes"], 8 << 20);
        usage.forget("u1");
        assert!(usage.summary("n1").pods.is_empty());
    }
}
