//! NodeAffinity: `nodeSelector` and required node affinity filter nodes by their labels (and
//! name); preferred node affinity terms add their weights to a node's score.

use k8s_openapi::api::core::v1::{NodeSelectorTerm, Pod};
use rkube_core::selector::LabelSelector;

use crate::framework::{
    normalize_to_max, CycleState, FilterPlugin, PreFilterPlugin, ScorePlugin, Status,
};
use crate::snapshot::NodeInfo;

/// A NodeSelectorTerm ready to match many nodes: its matchExpressions against the node's
/// labels, its matchFields against `metadata.name` (the only field Kubernetes allows).
pub struct Term {
    labels: LabelSelector,
    fields: LabelSelector,
    /// An empty term matches nothing (Kubernetes), nor does one with another field.
    matches_nothing: bool,
}

impl Term {
    pub fn new(term: &NodeSelectorTerm) -> Term {
        let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
        let fields = term.match_fields.as_deref().unwrap_or(&[]);
        Term {
            labels: LabelSelector::from_node_selector_requirements(exprs),
            fields: LabelSelector::from_node_selector_requirements(fields),
            matches_nothing: (exprs.is_empty() && fields.is_empty())
                || fields.iter().any(|r| r.key != "metadata.name"),
        }
    }

    pub fn matches(&self, node: &NodeInfo) -> bool {
        !self.matches_nothing
            && self.labels.matches_labels(node.labels())
            && self.fields.matches_with(|_| Some(node.name.as_str()))
    }
}

/// The pod's node affinity, compiled once per scheduling cycle.
struct Terms {
    /// None without required terms (every node passes); otherwise one must match.
    required: Option<Vec<Term>>,
    /// (weight, term)
    preferred: Vec<(i64, Term)>,
}

impl Terms {
    fn of(pod: &Pod) -> Terms {
        let affinity = pod
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref());
        Terms {
            required: affinity
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .map(|r| r.node_selector_terms.iter().map(Term::new).collect()),
            preferred: affinity
                .and_then(|a| {
                    a.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .into_iter()
                .flatten()
                .map(|p| (i64::from(p.weight), Term::new(&p.preference)))
                .collect(),
        }
    }

    /// The cycle's terms, or the pod's compiled now when PreFilter did not run.
    fn with<R>(pod: &Pod, state: &CycleState, f: impl FnOnce(&Terms) -> R) -> R {
        match state.get::<Terms>() {
            Some(t) => f(t),
            None => f(&Terms::of(pod)),
        }
    }
}

pub struct NodeAffinity;

impl PreFilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn pre_filter(&self, pod: &Pod, _: &[NodeInfo], state: &mut CycleState) {
        state.insert(Terms::of(pod));
    }
}

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, pod: &Pod, node: &NodeInfo, state: &CycleState) -> Status {
        let selector_ok = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_selector.as_ref())
            .is_none_or(|sel| sel.iter().all(|(k, v)| node.label(k) == Some(v.as_str())));
        let affinity_ok = selector_ok
            && Terms::with(pod, state, |t| {
                t.required
                    .as_ref()
                    .is_none_or(|terms| terms.iter().any(|t| t.matches(node)))
            });
        if affinity_ok {
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

    fn score(&self, pod: &Pod, node: &NodeInfo, _: &[&NodeInfo], state: &CycleState) -> i64 {
        Terms::with(pod, state, |t| {
            t.preferred
                .iter()
                .filter(|(_, term)| term.matches(node))
                .map(|(weight, _)| weight)
                .sum()
        })
    }

    fn normalize(&self, scores: &mut [i64]) {
        normalize_to_max(scores, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::testing::{NodeBuilder, PodBuilder};
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement, PreferredSchedulingTerm,
    };

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
