//! The scheduling framework, after kube-scheduler's: Filter plugins say whether a pod fits a
//! node (a [`Status`] with a code and the reasons, not a bare error), Score plugins rank the
//! nodes that fit (each normalized to 0..=100, then weighted), and [`schedule`] picks the best,
//! breaking ties at random. When no node fits, [`FitError`] counts the reasons across nodes and
//! words them as Kubernetes does.

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use rand::Rng;

use crate::snapshot::NodeInfo;

pub const MAX_SCORE: i64 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Success,
    /// The pod does not fit now; another node or a change to this one may help.
    Unschedulable,
    /// The pod can never fit this node (a node name or required affinity mismatch).
    UnschedulableAndUnresolvable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub reasons: Vec<String>,
}

impl Status {
    pub fn success() -> Status {
        Status {
            code: Code::Success,
            reasons: Vec::new(),
        }
    }

    pub fn unschedulable(reason: impl Into<String>) -> Status {
        Status {
            code: Code::Unschedulable,
            reasons: vec![reason.into()],
        }
    }

    pub fn unresolvable(reason: impl Into<String>) -> Status {
        Status {
            code: Code::UnschedulableAndUnresolvable,
            reasons: vec![reason.into()],
        }
    }

    pub fn is_success(&self) -> bool {
        self.code == Code::Success
    }
}

/// State a plugin computes once per scheduling cycle (in PreFilter) and reads per node, kept by
/// its type.
#[derive(Default)]
pub struct CycleState {
    values: HashMap<TypeId, Box<dyn Any + Send + Sync>>,
}

impl CycleState {
    pub fn insert<T: Any + Send + Sync>(&mut self, value: T) {
        self.values.insert(TypeId::of::<T>(), Box::new(value));
    }

    pub fn get<T: Any + Send + Sync>(&self) -> Option<&T> {
        self.values.get(&TypeId::of::<T>())?.downcast_ref()
    }
}

/// A PreFilter's verdict that no node can take the pod, whatever the node (a claim that is
/// not bound yet): the scheduling attempt ends with it before any node is filtered.
pub struct PreFilterRejection(pub String);

/// Runs once per pod before the filters, over every node.
pub trait PreFilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn pre_filter(&self, pod: &Pod, nodes: &[NodeInfo], state: &mut CycleState);
}

pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn filter(&self, pod: &Pod, node: &NodeInfo, state: &CycleState) -> Status;
}

pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;
    /// A raw score for one feasible node; `nodes` are all the feasible ones.
    fn score(&self, pod: &Pod, node: &NodeInfo, nodes: &[&NodeInfo], state: &CycleState) -> i64;
    /// Scales raw scores to 0..=MAX_SCORE; by default they already are.
    fn normalize(&self, _scores: &mut [i64]) {}
}

/// Scales scores so the highest becomes MAX_SCORE (Kubernetes' default normalization);
/// `reverse` makes the lowest raw score the best.
pub fn normalize_to_max(scores: &mut [i64], reverse: bool) {
    let max = scores.iter().copied().max().unwrap_or(0);
    for s in scores.iter_mut() {
        let scaled = if max == 0 { 0 } else { *s * MAX_SCORE / max };
        *s = if reverse {
            if max == 0 {
                MAX_SCORE
            } else {
                MAX_SCORE - scaled
            }
        } else {
            scaled
        };
    }
}

/// The enabled plugins with their score weights.
pub struct Profile {
    pub pre_filters: Vec<Box<dyn PreFilterPlugin>>,
    pub filters: Vec<Box<dyn FilterPlugin>>,
    pub scores: Vec<(Box<dyn ScorePlugin>, i64)>,
}

/// No node fits: how many nodes there were and, per reason, on how many nodes it applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FitError {
    pub nodes: usize,
    pub reasons: BTreeMap<String, usize>,
    /// Nodes that can never take the pod (UnschedulableAndUnresolvable): preemption skips them.
    pub unresolvable: Vec<String>,
    /// A PreFilter rejected the pod for every node: its reason alone is told.
    pub pre_filter: Option<String>,
}

impl std::fmt::Display for FitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = self
            .reasons
            .iter()
            .map(|(reason, n)| format!("{n} {reason}"))
            .collect();
        parts.sort();
        if let Some(reason) = &self.pre_filter {
            return write!(f, "0/{} nodes are available: {reason}.", self.nodes);
        }
        if parts.is_empty() {
            write!(f, "0/{} nodes are available.", self.nodes)
        } else {
            write!(
                f,
                "0/{} nodes are available: {}.",
                self.nodes,
                parts.join(", ")
            )
        }
    }
}

/// The PreFilter state of a pod over a set of nodes.
pub fn pre_filter(profile: &Profile, pod: &Pod, nodes: &[NodeInfo]) -> CycleState {
    let mut state = CycleState::default();
    for plugin in &profile.pre_filters {
        plugin.pre_filter(pod, nodes, &mut state);
    }
    state
}

/// The first failing filter's status on one node, or success.
pub fn run_filters(profile: &Profile, pod: &Pod, node: &NodeInfo, state: &CycleState) -> Status {
    for plugin in &profile.filters {
        let status = plugin.filter(pod, node, state);
        if !status.is_success() {
            return status;
        }
    }
    Status::success()
}

/// How many feasible nodes are enough to choose from (kube-scheduler's
/// percentageOfNodesToScore, adaptive): all of a small cluster, 50% minus 1% per 125 nodes of a
/// large one (at least 5%), never fewer than 100.
pub fn feasible_nodes_to_find(nodes: usize) -> usize {
    const MIN: usize = 100;
    if nodes <= MIN {
        return nodes;
    }
    let percentage = 50usize.saturating_sub(nodes / 125).max(5);
    (nodes * percentage / 100).max(MIN)
}

/// The node a pod should go to, looking at nodes from `start` round (the next search starts
/// where this one stopped, so all nodes get their turn) until enough feasible ones are found.
pub fn schedule(
    profile: &Profile,
    pod: &Pod,
    nodes: &[NodeInfo],
    rng: &mut impl Rng,
) -> Result<String, FitError> {
    schedule_from(profile, pod, nodes, rng, &mut 0)
}

pub fn schedule_from(
    profile: &Profile,
    pod: &Pod,
    nodes: &[NodeInfo],
    rng: &mut impl Rng,
    start: &mut usize,
) -> Result<String, FitError> {
    let state = pre_filter(profile, pod, nodes);
    if let Some(PreFilterRejection(reason)) = state.get::<PreFilterRejection>() {
        return Err(FitError {
            nodes: nodes.len(),
            reasons: BTreeMap::new(),
            unresolvable: nodes.iter().map(|n| n.name.clone()).collect(),
            pre_filter: Some(reason.clone()),
        });
    }
    let mut feasible: Vec<&NodeInfo> = Vec::new();
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut unresolvable = Vec::new();
    let enough = feasible_nodes_to_find(nodes.len());
    let n = nodes.len();
    let first = if n == 0 { 0 } else { *start % n };
    let mut looked = 0;
    for node in nodes[first..].iter().chain(nodes[..first].iter()) {
        if feasible.len() >= enough {
            break;
        }
        looked += 1;
        let status = run_filters(profile, pod, node, &state);
        if status.is_success() {
            feasible.push(node);
        } else {
            if status.code == Code::UnschedulableAndUnresolvable {
                unresolvable.push(node.name.clone());
            }
            for r in status.reasons {
                *reasons.entry(r).or_default() += 1;
            }
        }
    }
    *start = first + looked;
    if feasible.is_empty() {
        return Err(FitError {
            nodes: nodes.len(),
            reasons,
            unresolvable,
            pre_filter: None,
        });
    }
    let mut totals = vec![0i64; feasible.len()];
    for (plugin, weight) in &profile.scores {
        let mut scores: Vec<i64> = feasible
            .iter()
            .map(|n| plugin.score(pod, n, &feasible, &state))
            .collect();
        plugin.normalize(&mut scores);
        for (t, s) in totals.iter_mut().zip(scores) {
            *t += s.clamp(0, MAX_SCORE) * weight;
        }
    }
    let best = totals.iter().copied().max().unwrap_or(0);
    let top: Vec<usize> = (0..feasible.len()).filter(|i| totals[*i] == best).collect();
    let pick = top[rng.gen_range(0..top.len())];
    Ok(feasible[pick].name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fit_errors_are_worded_as_kubernetes_words_them() {
        let mut reasons = BTreeMap::new();
        reasons.insert("Insufficient cpu".to_string(), 2);
        reasons.insert(
            "node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }".to_string(),
            1,
        );
        let e = FitError {
            nodes: 3,
            reasons,
            unresolvable: vec![],
            pre_filter: None,
        };
        assert_eq!(
            e.to_string(),
            "0/3 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, 2 Insufficient cpu."
        );
    }

    #[test]
    fn large_clusters_are_sampled_as_kubernetes_samples_them() {
        assert_eq!(feasible_nodes_to_find(50), 50);
        assert_eq!(feasible_nodes_to_find(1000), 420);
        assert_eq!(feasible_nodes_to_find(5000), 500);
        assert_eq!(feasible_nodes_to_find(100_000), 5000);
    }

    #[test]
    fn normalization_scales_to_the_best() {
        let mut s = vec![10, 5, 0];
        normalize_to_max(&mut s, false);
        assert_eq!(s, vec![100, 50, 0]);
        let mut s = vec![10, 5, 0];
        normalize_to_max(&mut s, true);
        assert_eq!(s, vec![0, 50, 100]);
    }
}
