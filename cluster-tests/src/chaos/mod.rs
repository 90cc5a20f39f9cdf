//! The chaos harness: members as processes on hosts of their own (network namespaces), fault
//! proxies on every peer link, data dirs on powerfs when power is cut, faults injected at
//! random from a seed while clients run register, transaction, append and watch workloads,
//! and checkers over what they saw (linearizability, lost acknowledged writes, etcd's watch
//! guarantees, revisions that never decrease, every member's HashKV at the end).
//! `cargo run -p cluster-tests --bin chaos -- --help`.

pub mod campaign;
pub mod check;
pub mod faults;
pub mod k8s;
pub mod net;
pub mod proxy;
pub mod system;
pub mod workload;
