//! NodeAffinity: `nodeSelector` and required node affinity filter nodes by their labels (and
//! name); preferred node affinity terms add their weights to a node's score.

use serde_json::Value;

use crate::framework::{normalize_to_max, CycleState, FilterPlugin, ScorePlugin, Status};
use crate::snapshot::NodeInfo;

fn strs(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// One requirement of a node selector term against a value (None: the label is absent).
fn requirement(req: &Value, got: Option<&str>) -> bool {
    let values = strs(req.get("values"));
    match req.get("operator").and_then(Value::as_str) {
        Some("In") => got.is_some_and(|g| values.contains(&g)),
        Some("NotIn") => !got.is_some_and(|g| values.contains(&g)),
        Some("Exists") => got.is_some(),
        Some("DoesNotExist") => got.is_none(),
        Some(op @ ("Gt" | "Lt")) => {
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
pub fn term_matches(term: &Value, node: &NodeInfo) -> bool {
    let labels = node.labels();
    let exprs = term.get("matchExpressions").and_then(Value::as_array);
    let fields = term.get("matchFields").and_then(Value::as_array);
    if exprs.is_none_or(|e| e.is_empty()) && fields.is_none_or(|f| f.is_empty()) {
        // An empty term matches nothing (Kubernetes).
        return false;
    }
    exprs.into_iter().flatten().all(|r| {
        let key = r.get("key").and_then(Value::as_str).unwrap_or("");
        requirement(r, labels.and_then(|l| l.get(key)).and_then(Value::as_str))
    }) && fields.into_iter().flatten().all(|r| {
        let key = r.get("key").and_then(Value::as_str).unwrap_or("");
        key == "metadata.name" && requirement(r, Some(node.name.as_str()))
    })
}

pub struct NodeAffinity;

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, pod: &Value, node: &NodeInfo, _: &CycleState) -> Status {
        let labels = node.labels();
        let selector_ok = crate::snapshot::at(pod, &["spec", "nodeSelector"])
            .and_then(Value::as_object)
            .is_none_or(|sel| {
                sel.iter()
                    .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
            });
        let required = crate::snapshot::at(
            pod,
            &[
                "spec",
                "affinity",
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms",
            ],
        );
        let affinity_ok = required
            .and_then(Value::as_array)
            .is_none_or(|terms| terms.iter().any(|t| term_matches(t, node)));
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

    fn score(&self, pod: &Value, node: &NodeInfo, _: &[&NodeInfo], _: &CycleState) -> i64 {
        crate::snapshot::at(
            pod,
            &[
                "spec",
                "affinity",
                "nodeAffinity",
                "preferredDuringSchedulingIgnoredDuringExecution",
            ],
        )
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| p.get("preference").is_some_and(|t| term_matches(t, node)))
        .filter_map(|p| p.get("weight").and_then(Value::as_i64))
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
    use serde_json::json;

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
        let required = |expr: Value| {
            PodBuilder::new("p")
                .affinity(json!({"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}))
                .build()
        };
        for (expr, on_ssd, on_hdd) in [
            (
                json!({"key": "disk", "operator": "In", "values": ["ssd", "nvme"]}),
                true,
                false,
            ),
            (
                json!({"key": "disk", "operator": "NotIn", "values": ["ssd"]}),
                false,
                true,
            ),
            (json!({"key": "gen", "operator": "Exists"}), true, false),
            (
                json!({"key": "gen", "operator": "DoesNotExist"}),
                false,
                true,
            ),
            (
                json!({"key": "gen", "operator": "Gt", "values": ["4"]}),
                true,
                false,
            ),
            (
                json!({"key": "gen", "operator": "Lt", "values": ["4"]}),
                false,
                false,
            ),
        ] {
            let pod = required(expr.clone());
            assert_eq!(
                NodeAffinity
                    .filter(&pod, &ssd, &CycleState::default())
                    .is_success(),
                on_ssd,
                "{expr}"
            );
            assert_eq!(
                NodeAffinity
                    .filter(&pod, &hdd, &CycleState::default())
                    .is_success(),
                on_hdd,
                "{expr}"
            );
        }
        let by_name = PodBuilder::new("p")
            .affinity(json!({"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["b"]}]}]}}))
            .build();
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
        let pod = PodBuilder::new("p")
            .affinity(json!({"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 80, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
                {"weight": 20, "preference": {"matchExpressions": [{"key": "disk", "operator": "Exists"}]}}]}))
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
