//! NodeAffinity: `nodeSelector` and required node affinity filter nodes by their labels (and
//! name); preferred node affinity terms add their weights to a node's score.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

use crate::framework::{normalize_to_max, CycleState, FilterPlugin, ScorePlugin, Status};
use crate::snapshot::NodeInfo;

/// One requirement of a node selector term against a value (None: the label is absent).
fn requirement(req: &NodeSelectorRequirement, got: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    let listed = |g: &str| values.iter().any(|v| v == g);
    match req.operator.as_str() {
        "In" => got.is_some_and(listed),
        "NotIn" => !got.is_some_and(listed),
        "Exists" => got.is_some(),
        "DoesNotExist" => got.is_none(),
        op @ ("Gt" | "Lt") => {
            let (Some(g), Some(v)) = (
                got.and_then(|g| g.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if op == "Gt" {
                g > v
            } else {
                g < v
            }
        }
        _ => false,
    }
}

/// A NodeSelectorTerm: all its matchExpressions (labels) and matchFields (metadata.name).
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing (Kubernetes).
        return false;
    }
    exprs.iter().all(|r| requirement(r, node.label(&r.key)))
        && fields
            .iter()
            .all(|r| r.key == "metadata.name" && requirement(r, Some(node.name.as_str())))
}

pub struct NodeAffinity;

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, _: &CycleState) -> Status {
        let Some(spec) = pod.spec.as_ref() else {
            return Status::success();
        };
        let selector_ok = spec
            .node_selector
            .as_ref()
            .is_none_or(|sel| sel.iter().all(|(k, v)| node.label(k) == Some(v.as_str())));
        let required = spec
            .affinity
            .as_ref()
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            });
        let affinity_ok =
            required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)));
        if selector_ok && affinity_ok {
            Status::success()
        } else {
            Status::unresolvable("node(s) didn't match Pod's node affinity/selector")
        }
    }
}

impl ScorePlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn score(&self, pod: &Pod, node: &NodeInfo, _: &[&NodeInfo], _: &CycleState) -> i64 {
        pod.spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .into_iter()
            .flatten()
            .filter(|p| term_matches(&p.preference, node))
            .map(|p| i64::from(p.weight))
            .sum()
    }

    fn normalize(&self, scores: &mut [i64]) {
        normalize_to_max(scores, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use k8s_openapi::api::core::v1::{NodeSelector, PreferredSchedulingTerm};

    fn req(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn labels_term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(exprs),
            match_fields: None,
        }
    }

    fn required(term: NodeSelectorTerm) -> Pod {
        PodBuilder::new("p")
            .node_affinity(k8s_openapi::api::core::v1::NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: vec![term],
                }),
                ..Default::default()
            })
            .build()
    }

    #[test]
    fn selectors_and_required_terms_pick_nodes() {
        let ssd = NodeBuilder::new("a")
            .label("disk", "ssd")
            .label("gen", "5")
            .build();
        let hdd = NodeBuilder::new("b").label("disk", "hdd").build();
        let sel = PodBuilder::new("p").node_selector("disk", "ssd").build();
        assert!(NodeAffinity
            .filter(&sel, &ssd, &CycleState::default())
            .is_success());
        let s = NodeAffinity.filter(&sel, &hdd, &CycleState::default());
        assert_eq!(
            s.reasons,
            vec!["node(s) didn't match Pod's node affinity/selector".to_string()]
        );
        for (expr, on_ssd, on_hdd) in [
            (req("disk", "In", &["ssd", "nvme"]), true, false),
            (req("disk", "NotIn", &["ssd"]), false, true),
            (req("gen", "Exists", &[]), true, false),
            (req("gen", "DoesNotExist", &[]), false, true),
            (req("gen", "Gt", &["4"]), true, false),
            (req("gen", "Lt", &["4"]), false, false),
        ] {
            let pod = required(labels_term(vec![expr.clone()]));
            assert_eq!(
                NodeAffinity
                    .filter(&pod, &ssd, &CycleState::default())
                    .is_success(),
                on_ssd,
                "{expr:?}"
            );
            assert_eq!(
                NodeAffinity
                    .filter(&pod, &hdd, &CycleState::default())
                    .is_success(),
                on_hdd,
                "{expr:?}"
            );
        }
        let by_name = required(NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req("metadata.name", "In", &["b"])]),
        });
        assert!(!NodeAffinity
            .filter(&by_name, &ssd, &CycleState::default())
            .is_success());
        assert!(NodeAffinity
            .filter(&by_name, &hdd, &CycleState::default())
            .is_success());
    }

    #[test]
    fn preferred_terms_add_their_weights() {
        let ssd = NodeBuilder::new("a").label("disk", "ssd").build();
        let hdd = NodeBuilder::new("b").label("disk", "hdd").build();
        let prefer = |weight, expr| PreferredSchedulingTerm {
            weight,
            preference: labels_term(vec![expr]),
        };
        let pod = PodBuilder::new("p")
            .node_affinity(k8s_openapi::api::core::v1::NodeAffinity {
                preferred_during_scheduling_ignored_during_execution: Some(vec![
                    prefer(80, req("disk", "In", &["ssd"])),
                    prefer(20, req("disk", "Exists", &[])),
                ]),
                ..Default::default()
            })
            .build();
        assert_eq!(
            ScorePlugin::score(&NodeAffinity, &pod, &ssd, &[], &CycleState::default()),
            100
        );
        assert_eq!(
            ScorePlugin::score(&NodeAffinity, &pod, &hdd, &[], &CycleState::default()),
            20
        );
    }
}
