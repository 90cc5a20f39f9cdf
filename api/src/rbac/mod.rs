//! Authorization: who may do what, decided as Kubernetes' RBAC authorizer decides it.
//!
//! Every request becomes [`Attributes`] (a verb on a resource, or on a URL path) and
//! [`Authorizer::authorize`] answers it: members of `system:masters` may do everything (as
//! kube-apiserver's privileged-group authorizer); everyone else gets what the ClusterRoleBindings
//! naming them grant cluster-wide, plus what the RoleBindings of the request's namespace grant
//! there. The Roles, ClusterRoles and bindings are read from the member's store and kept current
//! by a watch per kind, so a decision never waits on the store.
//!
//! [`policy`] holds the default roles and bindings that bootstrap writes; ClusterRoles with an
//! `aggregationRule` get their rules from the ClusterRoles their selectors match
//! ([`Authorizer::aggregations`], written back by the leader as Kubernetes' aggregation
//! controller does).
//!
//! `attributes.rs` holds the request ([`Attributes`]) and its 403, `rule.rs` a PolicyRule and
//! how it matches, `cache.rs` the Roles and bindings as the authorizer keeps them,
//! `authorizer.rs` the decisions and aggregation, and `follow.rs` the list and watch that keep
//! the cache current.

mod attributes;
mod authorizer;
mod cache;
mod follow;
pub mod policy;
mod rule;
#[cfg(test)]
mod testing;

pub use attributes::{Attributes, Target};
pub use authorizer::{Authorizer, Decision, MASTERS};
pub(crate) use rule::strings;
pub use rule::Rule;
