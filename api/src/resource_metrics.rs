//! Resource metrics (`metrics.k8s.io/v1beta1`), as metrics-server keeps them: every API member
//! scrapes each node agent's Summary (`/stats/summary`) once per resolution (metrics-server's
//! `--metric-resolution`, 15 s by default) and keeps the newest two samples of each node and
//! container. A usage is then CPU as the rate between the two cumulative samples (over their
//! `window`), and memory as the newest working set; a container seen only once has no usage
//! yet, and a pod is reported only when all its containers have one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::Node;
use rkube_core::stats::{CpuStats, MemoryStats, Summary};

use crate::handler::Api;
use crate::resources;
use crate::storage::Freshness;

/// One cumulative sample: when, CPU time used so far (ns), working set (bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub time: DateTime<Utc>,
    pub cpu_ns: u64,
    pub memory: u64,
}

/// A usage worked out from two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// The newer sample's time.
    pub timestamp: DateTime<Utc>,
    pub window: Duration,
    pub nanocores: u64,
    pub memory: u64,
}

/// The newest two samples of something.
#[derive(Debug, Clone, Default)]
struct Series {
    prev: Option<Point>,
    last: Option<Point>,
}

impl Series {
    fn push(&mut self, p: Point) {
        if self.last.is_some_and(|l| l.time >= p.time) {
            return;
        }
        self.prev = self.last.replace(p);
    }

    fn usage(&self) -> Option<Usage> {
        usage(self.prev?, self.last?)
    }
}

/// The usage between two cumulative samples; None when the counter went back (a restarted
/// container) or no time passed.
pub fn usage(prev: Point, last: Point) -> Option<Usage> {
    let window = (last.time - prev.time).to_std().ok()?;
    if window.is_zero() || last.cpu_ns < prev.cpu_ns {
        return None;
    }
    let nanocores = (last.cpu_ns - prev.cpu_ns) as u128 * 1_000_000_000 / window.as_nanos();
    Some(Usage {
        timestamp: last.time,
        window,
        nanocores: nanocores as u64,
        memory: last.memory,
    })
}

/// One node's scrapes: the node's series and its containers', by (namespace, pod, container).
#[derive(Debug, Default)]
struct NodeSeries {
    node: Series,
    containers: HashMap<(String, String, String), Series>,
}

/// The samples of every node this member scraped.
#[derive(Debug, Default)]
pub struct MetricsCache {
    nodes: Mutex<HashMap<String, NodeSeries>>,
}

/// One container's usage in a pod's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    pub usage: Usage,
}

/// A sample of cumulative CPU time and working set; none without a CPU figure (a working set
/// the runtime did not give counts as 0).
fn point(cpu: Option<&CpuStats>, memory: Option<&MemoryStats>) -> Option<Point> {
    let cpu = cpu?;
    let time = DateTime::parse_from_rfc3339(&cpu.time)
        .ok()?
        .with_timezone(&Utc);
    Some(Point {
        time,
        cpu_ns: cpu.usage_core_nano_seconds?,
        memory: memory.and_then(|m| m.working_set_bytes).unwrap_or(0),
    })
}

impl MetricsCache {
    /// Takes in one Summary of `node`; containers absent from it are forgotten.
    pub fn record(&self, node: &str, summary: &Summary) {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        let entry = nodes.entry(node.to_string()).or_default();
        if let Some(p) = point(summary.node.cpu.as_ref(), summary.node.memory.as_ref()) {
            entry.node.push(p);
        }
        let mut seen = HashMap::new();
        for pod in &summary.pods {
            for c in &pod.containers {
                let Some(p) = point(c.cpu.as_ref(), c.memory.as_ref()) else {
                    continue;
                };
                let key = (
                    pod.pod_ref.namespace.clone(),
                    pod.pod_ref.name.clone(),
                    c.name.clone(),
                );
                let mut series = entry.containers.remove(&key).unwrap_or_default();
                series.push(p);
                seen.insert(key, series);
            }
        }
        entry.containers = seen;
    }

    /// Forgets nodes that are gone.
    pub fn retain(&self, nodes: &[String]) {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|n, _| nodes.contains(n));
    }

    pub fn node(&self, node: &str) -> Option<Usage> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        nodes.get(node)?.node.usage()
    }

    /// A pod's containers' usage, when every container it reports has one.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<Vec<ContainerUsage>> {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        for n in nodes.values() {
            let mut found = Vec::new();
            let mut complete = true;
            for ((ns, pod, c), series) in &n.containers {
                if ns != namespace || pod != name {
                    continue;
                }
                match series.usage() {
                    Some(usage) => found.push(ContainerUsage {
                        name: c.clone(),
                        usage,
                    }),
                    None => complete = false,
                }
            }
            if !found.is_empty() || !complete {
                found.sort_by(|a, b| a.name.cmp(&b.name));
                return complete.then_some(found);
            }
        }
        None
    }
}

/// Where a Node's agent listens: its InternalIP and kubelet port.
fn agent_address(node: &Node) -> Option<(String, u16)> {
    let status = node.status.as_ref()?;
    let host = status
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")?
        .address
        .clone();
    let port = status
        .daemon_endpoints
        .as_ref()
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map_or(10250, |k| k.port);
    Some((host, u16::try_from(port).ok()?))
}

impl Api {
    /// Scrapes every node's agent once per `resolution`, until the process ends.
    pub fn start_metrics_scraper(self: Arc<Self>, resolution: Duration) {
        let Some(tls) = self.kubelet_tls.clone() else {
            tracing::info!("no kubelet client certificate: resource metrics are not scraped");
            return;
        };
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(resolution.max(Duration::from_millis(100)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let nodes = match resources::find("", "v1", "nodes") {
                    Some(res) => {
                        let prefix = res.prefix(None);
                        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
                        match self.store.range(&prefix, &end, 0, Freshness::Any).await {
                            Ok((kvs, _, _)) => kvs
                                .iter()
                                .filter_map(|kv| serde_json::from_slice::<Node>(&kv.value).ok())
                                .collect::<Vec<_>>(),
                            Err(_) => continue,
                        }
                    }
                    None => continue,
                };
                let names: Vec<String> = nodes
                    .iter()
                    .map(|n| rkube_core::meta::name(&n.metadata).to_string())
                    .collect();
                self.metrics.retain(&names);
                let scrapes = nodes.iter().zip(&names).filter_map(|(n, name)| {
                    let (host, port) = agent_address(n)?;
                    let (tls, api) = (tls.clone(), self.clone());
                    Some(async move {
                        let fetch = async {
                            let resp =
                                crate::nodeproxy::get(tls, &host, port, "/stats/summary").await.ok()?;
                            if !resp.status().is_success() {
                                return None;
                            }
                            let body = resp.into_body().collect().await.ok()?.to_bytes();
                            serde_json::from_slice::<Summary>(&body).ok()
                        };
                        match tokio::time::timeout(resolution.max(Duration::from_secs(1)), fetch)
                            .await
                        {
                            Ok(Some(summary)) => api.metrics.record(name, &summary),
                            _ => tracing::debug!(node = %name, "scraping the node's resource usage failed"),
                        }
                    })
                });
                futures::future::join_all(scrapes).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rkube_core::stats::{ContainerStats, NodeStats, PodReference, PodStats};
    use serde_json::json;

    fn summary(secs: i64, node_ns: u64, web_ns: Option<u64>) -> Summary {
        let t = DateTime::from_timestamp(1_700_000_000 + secs, 0)
            .unwrap()
            .to_rfc3339();
        let cpu = |ns| {
            Some(CpuStats {
                time: t.clone(),
                usage_core_nano_seconds: Some(ns),
            })
        };
        let memory = |bytes| {
            Some(MemoryStats {
                time: t.clone(),
                working_set_bytes: Some(bytes),
            })
        };
        let web = web_ns.map(|ns| PodStats {
            pod_ref: PodReference {
                name: "web".into(),
                namespace: "default".into(),
                uid: "u1".into(),
            },
            start_time: None,
            containers: vec![ContainerStats {
                name: "c".into(),
                start_time: None,
                cpu: cpu(ns),
                memory: memory(500),
            }],
        });
        Summary {
            node: NodeStats {
                node_name: "n1".into(),
                cpu: cpu(node_ns),
                memory: memory(1000),
            },
            pods: web.into_iter().collect(),
        }
    }

    #[test]
    fn usage_is_the_rate_between_two_scrapes() {
        let cache = MetricsCache::default();
        cache.record("n1", &summary(0, 0, Some(0)));
        assert_eq!(cache.node("n1"), None, "one sample has no rate");
        assert_eq!(cache.pod("default", "web"), None);
        // 15 s later: 3 CPU-seconds on the node (200m), 1.5 in the pod (100m).
        cache.record("n1", &summary(15, 3_000_000_000, Some(1_500_000_000)));
        let node = cache.node("n1").unwrap();
        assert_eq!(node.nanocores, 200_000_000);
        assert_eq!(node.window, Duration::from_secs(15));
        assert_eq!(node.memory, 1000);
        let pod = cache.pod("default", "web").unwrap();
        assert_eq!(pod[0].name, "c");
        assert_eq!(pod[0].usage.nanocores, 100_000_000);
        assert_eq!(pod[0].usage.memory, 500);
        // A pod absent from the next scrape is gone; the same sample twice changes nothing.
        cache.record("n1", &summary(30, 6_000_000_000, None));
        assert_eq!(cache.pod("default", "web"), None);
        cache.retain(&[]);
        assert_eq!(cache.node("n1"), None);
    }

    /// What the agent writes is what the scraper reads: a container the runtime gave no CPU
    /// figure for has no sample.
    #[test]
    fn the_agents_summary_bytes_are_read() {
        let mut sent = summary(0, 5, Some(7));
        sent.pods[0].containers[0]
            .cpu
            .as_mut()
            .unwrap()
            .usage_core_nano_seconds = None;
        let bytes = serde_json::to_vec(&sent).unwrap();
        let cache = MetricsCache::default();
        cache.record("n1", &serde_json::from_slice(&bytes).unwrap());
        cache.record("n1", &summary(10, 10_000_000_005, Some(9)));
        assert_eq!(cache.node("n1").unwrap().nanocores, 1_000_000_000);
        assert_eq!(
            cache.pod("default", "web"),
            None,
            "one sample of the container"
        );
    }

    #[test]
    fn a_nodes_agent_is_at_its_internal_ip_and_kubelet_port() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"},
                                     {"type": "InternalIP", "address": "10.0.0.7"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10350}}}
        }))
        .unwrap();
        assert_eq!(agent_address(&node), Some(("10.0.0.7".into(), 10350)));
        let mut bare = node.clone();
        bare.status.as_mut().unwrap().daemon_endpoints = None;
        assert_eq!(agent_address(&bare), Some(("10.0.0.7".into(), 10250)));
        bare.status.as_mut().unwrap().addresses = None;
        assert_eq!(agent_address(&bare), None);
    }

    #[test]
    fn a_counter_that_goes_back_has_no_rate() {
        let t0 = DateTime::from_timestamp(0, 0).unwrap();
        let p = |s: i64, ns: u64| Point {
            time: t0 + chrono::Duration::seconds(s),
            cpu_ns: ns,
            memory: 0,
        };
        assert_eq!(usage(p(0, 10), p(10, 5)), None);
        assert_eq!(usage(p(10, 0), p(10, 5)), None);
        assert_eq!(
            usage(p(0, 0), p(10, 5_000_000_000)).unwrap().nanocores,
            500_000_000
        );
    }
}
