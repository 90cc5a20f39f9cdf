//! The controllers of an rkube control plane. They run in the server process of the Raft leader
//! ([`manager`]), read shared informer caches of the member's own store, take keys from
//! rate-limited work queues, write through the API's in-process client (the same validation and
//! admission as any client) and record events as Kubernetes does: informers, queues, events and
//! the per-term manager are `rkube_runtime`'s.
//!
//! Controllers: [`replicaset`] (ReplicaSets and ReplicationControllers), [`deployment`],
//! [`daemonset`] (one pod per eligible node, rolled through ControllerRevisions),
//! [`statefulset`] (pods with stable names, storage and order), [`job`] and [`cronjob`], [`disruption`] (PodDisruptionBudgets' status, which evictions
//! read), [`endpoints`] (Endpoints and EndpointSlices of Services), [`garbagecollector`] (owner
//! references: Background, Foreground and Orphan deletion), [`nodelifecycle`] (heartbeats,
//! NotReady/Unknown, taints and evictions), [`rootcacert`] (the cluster CA in every
//! namespace), [`volume`] (the PV binder, volume protection and the local-path provisioner), and the leader's [`compaction`] of the store's history.

// ApiError carries a Kubernetes Status; it is returned by value on error paths, which are not
// hot.
#![allow(clippy::result_large_err)]

pub mod certificates;
pub mod compaction;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod garbagecollector;
pub mod history;
pub mod job;
pub mod loadbalancer;
pub mod manager;
pub mod nodelifecycle;
pub mod podautoscaler;
pub mod podgc;
pub mod pods;
pub mod replicaset;
pub mod rootcacert;
pub mod statefulset;
pub mod volume;

pub use manager::{start, Settings};

/// A write whose object is gone (404) or moved (409) meanwhile is not an error for a
/// controller: the informer's event about it brings another sync.
pub(crate) use rkube_runtime::client::ignore_gone;
