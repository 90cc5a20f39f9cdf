//! What rkube's controllers and scheduler are built from: [`informer`] caches of the member's own
//! store and their typed views ([`store`]), rate-limited work [`queue`]s, the [`controller`]
//! builder that wires a reconcile to them (kube-rs' `Controller` is the model), typed writes
//! through the in-process [`client`], [`events`] recorded as Kubernetes records them, and the
//! [`manager`] that runs them for each Raft term this member leads.

// ApiError carries a Kubernetes Status; it is returned by value on error paths, which are not
// hot.
#![allow(clippy::result_large_err)]

pub mod cache;
pub mod client;
pub mod controller;
pub mod events;
pub mod informer;
pub mod manager;
pub mod queue;
pub mod store;
