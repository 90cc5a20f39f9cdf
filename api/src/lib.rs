//! The Kubernetes API server of an rkube control-plane member.
//!
//! Every member serves the whole API over HTTPS. Objects are JSON values in the member's
//! replicated store under Kubernetes' /registry keys ([`resources`] maps URLs to keys); reads
//! come from the member's applied state (a quorum read index first, unless the client asked for
//! resourceVersion=0), writes are store transactions proposed through the Raft leader
//! ([`storage`]), with their fields in Kubernetes' order ([`order`]). [`handler`] routes a request to a verb; [`discovery`] answers the discovery
//! documents kubectl reads first; [`openapi`] the OpenAPI documents of the served types, which
//! [`fieldvalidation`] also checks request bodies against.

// ApiError carries a Kubernetes Status (message, causes); it is returned by value on the
// error path of every request, which is not hot.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod apply;
pub mod auth;
mod bootstrap;
pub mod bootstrap_token;
pub mod certificates;
pub mod client;
pub mod discovery;
pub mod dns;
pub mod encoding;
pub mod error;
pub mod events;
pub mod fieldvalidation;
pub mod handler;
pub mod limitrange;
pub mod node_authz;
pub mod nodeproxy;
pub mod openapi;
pub mod order;
pub mod patch;
pub mod protobuf;
pub mod quantities;
pub mod query;
pub mod quota;
pub mod rbac;
pub mod resource_metrics;
pub mod resources;
mod reviews;
pub mod server;
pub mod serviceaccount;
pub mod services;
pub mod status_page;
pub mod storage;
pub mod strategic;
pub mod strategy;
pub mod table;
pub mod token;
pub mod value;
pub mod view;

pub use server::{start, ApiConfig, ApiServer};
