//! The scheduler of an rkube control plane: kube-scheduler's framework ([`framework`]) with its
//! default plugins ([`plugins`]: NodeUnschedulable, NodeName, TaintToleration, NodeAffinity and
//! nodeSelector, NodePorts, NodeResourcesFit with LeastAllocated scoring,
//! NodeResourcesBalancedAllocation, InterPodAffinity, PodTopologySpread, ImageLocality) over a [`snapshot`] of nodes and their pods, run on the Raft
//! leader by [`runner`], which binds pods through the API, and [`preemption`] of lower-priority
//! pods when nothing fits. Pods and nodes are k8s-openapi's types, from the informers' typed
//! views (decoded once per change, shared with the controllers); label
//! selectors, quantities and taint matching are rkube-core's.

pub mod cache;
pub mod framework;
pub mod plugins;
pub mod preemption;
pub mod runner;
pub mod snapshot;
