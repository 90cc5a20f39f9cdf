//! Which nodes run a DaemonSet's pod, and the pod made for one node.
//!
//! A node should run the pod when the template's nodeSelector, required node affinity and
//! nodeName admit it and its NoSchedule and NoExecute taints are tolerated; a pod already
//! there may stay as long as only NoSchedule taints are untolerated (Kubernetes'
//! `NodeShouldRunDaemonPod`). The tolerations the controller adds to every daemon pod are
//! counted: a daemon pod stays on a node that is not ready, unreachable, under pressure or
//! cordoned, and the control-plane taint keeps it off unless its template tolerates it.
//!
//! The pod made for a node carries the revision's hash label and a required node affinity on
//! `metadata.name` in place of the template's required terms, so the scheduler places it on
//! that node and nowhere else.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodSpec, Taint, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rkube_core::meta::{controller_ref, name, namespace};
use rkube_core::selector::LabelSelector;
use rkube_core::taints::tolerates_taint;

/// The label of a daemon pod (and of a revision) that names its revision's hash.
pub use crate::history::HASH_LABEL;
/// The label of a daemon pod that names the DaemonSet's template generation.
pub const GENERATION_LABEL: &str = "pod-template-generation";
/// The annotation the API keeps the template generation in.
pub const GENERATION_ANNOTATION: &str = "deprecated.daemonset.template.generation";

/// Whether a node should run the daemon pod, and whether a daemon pod already on it may stay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub should_run: bool,
    pub may_stay: bool,
}

/// The tolerations Kubernetes' DaemonSet controller gives every daemon pod: (key, effect).
/// `network-unavailable` only for pods on the host's network.
const DAEMON_TOLERATIONS: &[(&str, &str)] = &[
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];
const NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Adds the daemon tolerations the spec does not have yet (an Exists toleration of the key
/// and effect; one the template already has for that key and effect is kept as it is).
pub fn add_daemon_tolerations(spec: &mut PodSpec) {
    let host_network = spec.host_network == Some(true);
    let wanted = DAEMON_TOLERATIONS
        .iter()
        .copied()
        .chain(host_network.then_some((NETWORK_UNAVAILABLE, "NoSchedule")));
    let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
    for (key, effect) in wanted {
        let present = tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(key) && t.effect.as_deref() == Some(effect));
        if !present {
            tolerations.push(Toleration {
                key: Some(key.into()),
                operator: Some("Exists".into()),
                effect: Some(effect.into()),
                ..Default::default()
            });
        }
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    // An empty term, or one on a field other than the name, matches nothing (Kubernetes).
    if (exprs.is_empty() && fields.is_empty()) || fields.iter().any(|r| r.key != "metadata.name") {
        return false;
    }
    let node_name = name(&node.metadata);
    LabelSelector::from_node_selector_requirements(exprs)
        .matches_labels(node.metadata.labels.as_ref())
        && LabelSelector::from_node_selector_requirements(fields).matches_with(|_| Some(node_name))
}

/// The template's nodeSelector and required node affinity admit the node.
fn fits_affinity(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let selector_ok = spec.node_selector.as_ref().is_none_or(|sel| {
        sel.iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    });
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector_ok
        && required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, node)))
}

fn untolerated<'a>(spec: &PodSpec, taints: &'a [Taint], effect: &str) -> Option<&'a Taint> {
    let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
    taints
        .iter()
        .filter(|t| t.effect == effect)
        .find(|taint| !tolerations.iter().any(|t| tolerates_taint(t, taint)))
}

/// Where the daemon pod of `spec` (the template's spec with the daemon tolerations added)
/// belongs with respect to `node`.
pub fn placement(spec: &PodSpec, node: &Node) -> Placement {
    let nowhere = Placement {
        should_run: false,
        may_stay: false,
    };
    let node_name = name(&node.metadata);
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node_name)
    {
        return nowhere;
    }
    if !fits_affinity(spec, node) {
        return nowhere;
    }
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or(&[]);
    let no_execute = untolerated(spec, taints, "NoExecute").is_some();
    let no_schedule = untolerated(spec, taints, "NoSchedule").is_some();
    Placement {
        should_run: !no_execute && !no_schedule,
        may_stay: !no_execute,
    }
}

/// The template's pod spec with the daemon tolerations: what placement is decided for.
pub fn daemon_spec(ds: &DaemonSet) -> PodSpec {
    let mut spec = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .unwrap_or_default();
    add_daemon_tolerations(&mut spec);
    spec
}

/// The DaemonSet's template generation (the API's annotation), if it has one.
pub fn template_generation(ds: &DaemonSet) -> Option<&str> {
    ds.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(GENERATION_ANNOTATION))
        .map(String::as_str)
}

/// The affinity with its required node terms replaced by one on the node's name
/// (Kubernetes' `ReplaceDaemonSetPodNodeNameNodeAffinity`); preferred terms and pod
/// (anti-)affinity are kept.
fn pinned_to(affinity: Option<Affinity>, node: &str) -> Affinity {
    let selector = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
        }],
    };
    let mut affinity = affinity.unwrap_or_default();
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    node_affinity.required_during_scheduling_ignored_during_execution = Some(selector);
    affinity
}

/// The daemon pod of revision `hash` for `node`.
pub fn pod_for_node(ds: &DaemonSet, node: &str, hash: &str) -> Pod {
    let meta = &ds.metadata;
    let template = ds.spec.as_ref().map(|s| &s.template);
    let t = template.and_then(|t| t.metadata.as_ref());
    let mut labels: BTreeMap<String, String> = t.and_then(|t| t.labels.clone()).unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    if let Some(g) = template_generation(ds) {
        labels.insert(GENERATION_LABEL.into(), g.into());
    }
    let mut spec = daemon_spec(ds);
    spec.affinity = Some(pinned_to(spec.affinity.take(), node));
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-", name(meta))),
            namespace: Some(namespace(meta).to_string()),
            labels: Some(labels),
            annotations: t.and_then(|t| t.annotations.clone()),
            finalizers: t.and_then(|t| t.finalizers.clone()),
            owner_references: Some(vec![controller_ref(ds)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

/// The node a daemon pod is for: the node it is bound to, or the one its required node
/// affinity names by `metadata.name` while it waits for the scheduler.
pub fn target_node(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(n);
    }
    let terms = &spec
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    terms.iter().find_map(|t| {
        t.match_fields.as_ref()?.iter().find_map(|r| {
            let one = r.values.as_deref().filter(|v| v.len() == 1)?;
            (r.key == "metadata.name" && r.operator == "In").then(|| one[0].as_str())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
                                      "spec": {"taints": taints}}))
        .unwrap()
    }

    fn ds(spec: Value) -> DaemonSet {
        serde_json::from_value(json!({"metadata": {"name": "agent", "namespace": "ns"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec}}}))
        .unwrap()
    }

    const RUN: Placement = Placement {
        should_run: true,
        may_stay: true,
    };
    const NOWHERE: Placement = Placement {
        should_run: false,
        may_stay: false,
    };
    const STAY: Placement = Placement {
        should_run: false,
        may_stay: true,
    };

    #[test]
    fn which_nodes_run_a_daemon_pod() {
        let plain = json!({"containers": [{"name": "c", "image": "i"}]});
        let control_plane =
            json!([{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]);
        // (what the case shows, template spec, node labels, node taints, placement)
        let cases = [
            ("any node", plain.clone(), json!({}), json!([]), RUN),
            (
                "a nodeSelector that matches",
                json!({"nodeSelector": {"disk": "ssd"}}),
                json!({"disk": "ssd"}),
                json!([]),
                RUN,
            ),
            (
                "a nodeSelector that does not",
                json!({"nodeSelector": {"disk": "ssd"}}),
                json!({"disk": "hdd"}),
                json!([]),
                NOWHERE,
            ),
            (
                "required node affinity",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}}),
                json!({"zone": "c"}),
                json!([]),
                NOWHERE,
            ),
            (
                "required node affinity by name",
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchFields": [
                        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}),
                json!({}),
                json!([]),
                RUN,
            ),
            (
                "the control-plane taint keeps it off",
                plain.clone(),
                json!({}),
                control_plane.clone(),
                STAY,
            ),
            (
                "unless tolerated",
                json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                                        "operator": "Exists", "effect": "NoSchedule"}]}),
                json!({}),
                control_plane,
                RUN,
            ),
            (
                "an untolerated NoExecute taint evicts",
                plain.clone(),
                json!({}),
                json!([{"key": "dedicated", "value": "db", "effect": "NoExecute"}]),
                NOWHERE,
            ),
            (
                "not-ready, pressure and cordoned nodes keep their daemons",
                plain.clone(),
                json!({}),
                json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"},
                       {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                       {"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/pid-pressure", "effect": "NoSchedule"},
                       {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
                RUN,
            ),
            (
                "network-unavailable is tolerated on the host network only",
                plain.clone(),
                json!({}),
                json!([{"key": NETWORK_UNAVAILABLE, "effect": "NoSchedule"}]),
                STAY,
            ),
            (
                "as on the host network",
                json!({"hostNetwork": true}),
                json!({}),
                json!([{"key": NETWORK_UNAVAILABLE, "effect": "NoSchedule"}]),
                RUN,
            ),
            (
                "a template naming another node",
                json!({"nodeName": "n2"}),
                json!({}),
                json!([]),
                NOWHERE,
            ),
        ];
        for (what, spec, labels, taints, want) in cases {
            let mut spec = spec;
            spec["containers"] = json!([{"name": "c", "image": "i"}]);
            let d = ds(spec);
            let got = placement(&daemon_spec(&d), &node("n1", labels, taints));
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_pod_is_pinned_to_its_node_and_labelled_with_its_revision() {
        let mut d = ds(json!({"containers": [{"name": "c", "image": "i"}],
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                             "effect": "NoExecute", "tolerationSeconds": 30}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}));
        d.metadata.annotations = Some([(GENERATION_ANNOTATION.into(), "3".into())].into());
        let pod = pod_for_node(&d, "n1", "5d4f");
        let labels = pod.metadata.labels.clone().unwrap();
        assert_eq!(labels[HASH_LABEL], "5d4f");
        assert_eq!(labels[GENERATION_LABEL], "3");
        assert_eq!(labels["app"], "agent");
        assert_eq!(pod.metadata.generate_name.as_deref(), Some("agent-"));
        assert_eq!(target_node(&pod), Some("n1"));
        let v = serde_json::to_value(&pod.spec).unwrap();
        assert_eq!(
            v["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]})
        );
        let tolerations = v["tolerations"].as_array().unwrap();
        assert_eq!(
            tolerations.len(),
            6,
            "the template's own not-ready one is kept"
        );
        assert_eq!(tolerations[0]["tolerationSeconds"], 30);
    }
}
