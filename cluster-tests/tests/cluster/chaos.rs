//! A short chaos campaign (`cluster_tests::chaos`): three rkube servers on hosts of their own,
//! every fault kind once in a seeded order while clients write, read, compare-and-set, move
//! two keys together, append and watch; nothing acknowledged is lost, the history is
//! linearizable, watches keep etcd's guarantees and revisions never go back. Needs root (it
//! makes network namespaces), as the container tests do. The long campaign is the `chaos`
//! binary (RELIABILITY.md).

use std::time::Duration;

use cluster_tests::chaos::campaign::{self, Config, Fault};
use cluster_tests::chaos::system::{Kind, Tuning};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_chaos_campaign_loses_nothing_and_stays_linearizable() {
    let (_turn, _) = cluster_tests::exclusive_ports(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261204);
    let summary = campaign::run(Config {
        system: Kind::Rkube,
        seed,
        // One round: every fault kind once (a round once started is finished).
        duration: Duration::from_secs(1),
        faults: Fault::ALL.to_vec(),
        clients: 6,
        watchers: 3,
        dir: dir.path().to_path_buf(),
        rkube_bin: cluster_tests::rkube_bin().to_path_buf(),
        tuning: Tuning::default(),
    })
    .await
    .expect("the campaign runs");
    println!("{}", summary.table());
    let kinds: std::collections::BTreeSet<_> = summary.faults.iter().map(|f| f.fault).collect();
    assert_eq!(
        kinds.len(),
        Fault::ALL.len(),
        "one round injects every kind of fault: {kinds:?}"
    );
    if !summary.passed() {
        let kept = dir.keep();
        panic!(
            "the campaign failed (seed {seed}; members' logs and histories kept in {}):\n{}",
            kept.display(),
            summary.table()
        );
    }
}
