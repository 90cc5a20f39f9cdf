//! The kubelet's Summary API (`stats/v1alpha1`, `GET /stats/summary` on a node agent's HTTPS
//! port), with the fields rkube's two sides of it use: the agent reports them, the API server
//! scrapes them for resource metrics (`metrics.k8s.io`) as metrics-server does.
//!
//! Fields are in the order of the kubelet's Go structs. A figure the runtime did not give is
//! written `null`; reading, a figure or part that is absent is `None` (a kubelet leaves empty
//! ones out), and fields rkube does not use are ignored.

use serde::{Deserialize, Serialize};

/// A node's Summary: the node's totals and each of its pods' containers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    #[serde(default)]
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(default)]
    pub cpu: Option<CpuStats>,
    #[serde(default)]
    pub memory: Option<MemoryStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default)]
    pub containers: Vec<ContainerStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default)]
    pub cpu: Option<CpuStats>,
    #[serde(default)]
    pub memory: Option<MemoryStats>,
}

/// Cumulative CPU time, sampled at `time` (RFC 3339).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: String,
    #[serde(default)]
    pub usage_core_nano_seconds: Option<u64>,
}

/// The memory working set, sampled at `time` (RFC 3339).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    #[serde(default)]
    pub working_set_bytes: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Summary {
        let cpu = |ns| {
            Some(CpuStats {
                time: "2026-01-01T00:00:00Z".into(),
                usage_core_nano_seconds: Some(ns),
            })
        };
        let memory = Some(MemoryStats {
            time: "2026-01-01T00:00:00Z".into(),
            working_set_bytes: Some(4096),
        });
        Summary {
            node: NodeStats {
                node_name: "n1".into(),
                cpu: cpu(7),
                memory: memory.clone(),
            },
            pods: vec![PodStats {
                pod_ref: PodReference {
                    name: "web".into(),
                    namespace: "default".into(),
                    uid: "u1".into(),
                },
                start_time: None,
                containers: vec![ContainerStats {
                    name: "c".into(),
                    start_time: None,
                    cpu: cpu(3),
                    memory: None,
                }],
            }],
        }
    }

    #[test]
    fn a_summary_reads_back_what_was_written_in_the_kubelets_field_order() {
        let text = serde_json::to_string(&sample()).unwrap();
        assert_eq!(
            text,
            concat!(
                r#"{"node":{"nodeName":"n1","cpu":{"time":"2026-01-01T00:00:00Z","usageCoreNanoSeconds":7},"#,
                r#""memory":{"time":"2026-01-01T00:00:00Z","workingSetBytes":4096}},"#,
                r#""pods":[{"podRef":{"name":"web","namespace":"default","uid":"u1"},"#,
                r#""containers":[{"name":"c","cpu":{"time":"2026-01-01T00:00:00Z","usageCoreNanoSeconds":3},"#,
                r#""memory":null}]}]}"#
            )
        );
        assert_eq!(serde_json::from_str::<Summary>(&text).unwrap(), sample());
    }

    #[test]
    fn a_kubelets_summary_with_more_fields_and_fewer_figures_reads() {
        let text = r#"{"node":{"nodeName":"n1","systemContainers":[],"cpu":{"time":"t"},
            "fs":{"availableBytes":1}},"pods":[{"podRef":{"name":"p","namespace":"d","uid":"u"},
            "containers":[{"name":"c","rootfs":{}}],"volume":[]}]}"#;
        let s: Summary = serde_json::from_str(text).unwrap();
        assert_eq!(s.node.cpu.unwrap().usage_core_nano_seconds, None);
        assert_eq!(s.node.memory, None);
        assert_eq!(s.pods[0].containers[0].cpu, None);
    }
}
