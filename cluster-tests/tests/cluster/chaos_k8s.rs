//! The Kubernetes-level chaos campaign (`cluster_tests::chaos::k8s`), short: a minute and a
//! half of leader kills and pauses, member kills, kills of the member holding the control-plane
//! endpoint and quorum losses while Kubernetes clients race
//! conditional updates, list, watch and resume, and a Deployment rolls out new images. Stale
//! resourceVersions are 409, compacted ones 410 and never a silent gap, no pod changes node,
//! the pods never outnumber replicas + maxSurge, and the Deployment converges afterwards.
//! `CHAOS_SEED` picks another seed.

use std::collections::BTreeSet;
use std::time::Duration;

use cluster_tests::chaos::faults::Fault;
use cluster_tests::chaos::k8s;
use cluster_tests::chaos::system::Kind;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubernetes_clients_keep_their_guarantees_through_member_faults() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261207);
    let summary = k8s::campaign(seed, Duration::from_secs(90))
        .await
        .expect("the campaign runs");
    println!("{}", summary.table());
    let kinds: BTreeSet<Fault> = summary.faults.iter().map(|f| f.fault).collect();
    assert_eq!(
        kinds.len(),
        Fault::all_for(Kind::Kubernetes).len(),
        "a minute and a half of faults injects every kind: {kinds:?}\n{}",
        summary.table()
    );
    assert!(
        summary.passed(),
        "the campaign failed (seed {seed}):\n{}",
        summary.table()
    );
}
