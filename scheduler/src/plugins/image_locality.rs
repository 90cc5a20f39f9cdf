//! ImageLocality: prefer nodes that already hold the pod's container images (from the node's
//! `status.images`), weighing each image by its size and by how many nodes have it (an image
//! everywhere is no reason to pick one node), scaled between 23 MB and 1,000 MB per container
//! as kube-scheduler scales it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{CycleState, PreFilterPlugin, ScorePlugin, MAX_SCORE};
use crate::snapshot::NodeInfo;

const MB: i64 = 1024 * 1024;
const MIN_THRESHOLD: i64 = 23 * MB;
const MAX_CONTAINER_THRESHOLD: i64 = 1000 * MB;

/// `nginx` is `nginx:latest`; a digest or a tag stays as it is.
pub fn normalize(image: &str) -> String {
    let name_part = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || name_part.contains(':') {
        image.to_string()
    } else {
        format!("{image}:latest")
    }
}

fn node_images(node: &NodeInfo) -> impl Iterator<Item = (String, i64)> + '_ {
    node.images.iter().cloned()
}

fn pod_images(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| c.image.as_deref())
        .map(normalize)
        .collect()
}

/// For each of the pod's images: on how many nodes it is.
struct Spread {
    nodes_with: HashMap<String, i64>,
    total: i64,
}

pub struct ImageLocality;

impl PreFilterPlugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn pre_filter(&self, pod: &Pod, nodes: &[NodeInfo], state: &mut CycleState) {
        let wanted = pod_images(pod);
        let mut nodes_with: HashMap<String, i64> = HashMap::new();
        if !wanted.is_empty() {
            for node in nodes {
                let mut seen: Vec<String> = Vec::new();
                for (name, _) in node_images(node) {
                    if wanted.contains(&name) && !seen.contains(&name) {
                        *nodes_with.entry(name.clone()).or_default() += 1;
                        seen.push(name);
                    }
                }
            }
        }
        state.insert(Spread {
            nodes_with,
            total: nodes.len() as i64,
        });
    }
}

impl ScorePlugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn score(&self, pod: &Pod, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        let Some(spread) = state.get::<Spread>() else {
            return 0;
        };
        let wanted = pod_images(pod);
        if wanted.is_empty() || spread.total == 0 {
            return 0;
        }
        let sizes: HashMap<String, i64> = node_images(node).collect();
        let sum: i64 = wanted
            .iter()
            .filter_map(|img| {
                let size = sizes.get(img)?;
                let with = spread.nodes_with.get(img).copied().unwrap_or(0);
                Some(size.saturating_mul(with) / spread.total)
            })
            .fold(0i64, |a, b| a.saturating_add(b));
        let max = MAX_CONTAINER_THRESHOLD.saturating_mul(wanted.len() as i64);
        let clamped = sum.clamp(MIN_THRESHOLD, max);
        MAX_SCORE * (clamped - MIN_THRESHOLD) / (max - MIN_THRESHOLD)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};

    #[test]
    fn nodes_with_the_image_score_higher() {
        let with = NodeBuilder::new("a")
            .image(&["docker.io/library/big:1", "big:1"], 800 * MB)
            .build();
        let without = NodeBuilder::new("b").build();
        let pod = PodBuilder::new("p").image("big:1").build();
        let nodes = vec![with, without];
        let mut st = CycleState::default();
        ImageLocality.pre_filter(&pod, &nodes, &mut st);
        let a = ImageLocality.score(&pod, &nodes[0], &[], &st);
        let b = ImageLocality.score(&pod, &nodes[1], &[], &st);
        assert!(a > b, "{a} {b}");
        assert_eq!(b, 0);
        assert_eq!(normalize("nginx"), "nginx:latest");
        assert_eq!(normalize("registry:5000/app"), "registry:5000/app:latest");
        assert_eq!(normalize("app@sha256:abc"), "app@sha256:abc");
    }
}
