//! What every rkube component shares and that belongs to none of them: Kubernetes' resource
//! quantities, label selectors, cron schedules, typed objects' metadata and owner references
//! ([`meta`]), resource paths ([`path`]), the kubelet's Summary API ([`stats`]), field accessors
//! for objects still held as JSON, taints and tolerations, the bootstrap token format, and
//! passing a streaming upgrade on. The store, the API, the controllers, the scheduler and the
//! agent depend on it; it depends on none of them.

pub mod bootstrap_token;
pub mod cron;
pub mod json;
pub mod meta;
pub mod path;
pub mod quantity;
pub mod selector;
pub mod stats;
pub mod taints;
pub mod upgrade;
pub mod volume;
