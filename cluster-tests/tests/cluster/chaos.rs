//! Short chaos campaigns (`cluster_tests::chaos`): three rkube servers on hosts of their own,
//! faults in a seeded order while clients write, read, compare-and-set, move two keys
//! together, append and watch; nothing acknowledged is lost, the history is linearizable,
//! watches keep etcd's guarantees, revisions never go back and the members end with the same
//! HashKV. Needs root (it makes network namespaces), as the container tests do; the power-loss
//! campaigns also need /dev/fuse (powerfs). The long campaign is the `chaos` binary
//! (RELIABILITY.md).

use std::time::Duration;

use cluster_tests::chaos::campaign::{self, Config, Fault, Summary};
use cluster_tests::chaos::system::{Kind, Tuning};

fn seed_or(default: u64) -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Runs the campaign; when it cannot finish (no leader at the end, say), keeps its dir (the
/// members' logs) and says where.
async fn run(dir: tempfile::TempDir, config: Config) -> (tempfile::TempDir, Summary) {
    match campaign::run(config).await {
        Ok(summary) => (dir, summary),
        Err(e) => {
            let kept = dir.keep();
            panic!(
                "the campaign could not finish (members' logs kept in {}): {e:#}",
                kept.display()
            );
        }
    }
}

fn config(dir: &std::path::Path, seed: u64, faults: Vec<Fault>) -> Config {
    Config {
        system: Kind::Rkube,
        seed,
        // One round: every fault listed once (a round once started is finished).
        duration: Duration::from_secs(1),
        power_fs: faults.iter().any(|f| f.is_power_cut()),
        faults,
        clients: 6,
        watchers: 3,
        dir: dir.to_path_buf(),
        rkube_bin: cluster_tests::rkube_bin().to_path_buf(),
        tuning: Tuning::default(),
        rkube_args: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_chaos_campaign_loses_nothing_and_stays_linearizable() {
    let (_turn, _) = cluster_tests::exclusive_ports(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let seed = seed_or(20261204);
    // Every kind but the power cuts, which have campaigns of their own below.
    let faults: Vec<Fault> = Fault::all_for(Kind::Rkube)
        .into_iter()
        .filter(|f| !f.is_power_cut())
        .collect();
    let c = config(dir.path(), seed, faults.clone());
    let (dir, summary) = run(dir, c).await;
    println!("{}", summary.table());
    let kinds: std::collections::BTreeSet<_> = summary.faults.iter().map(|f| f.fault).collect();
    assert_eq!(
        kinds.len(),
        faults.len(),
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

/// The power cuts: a follower, the leader, two members, and all three twice (the all-three
/// cut is the one a store that does not sync cannot survive), in one seeded round, while the
/// clients keep writing.
fn power_schedule() -> Vec<Fault> {
    vec![
        Fault::PowerFollower,
        Fault::PowerLeader,
        Fault::PowerTwo,
        Fault::PowerAll,
        Fault::PowerAll,
    ]
}

async fn power_campaign(seed: u64, rkube_args: &[&str]) -> (tempfile::TempDir, Summary) {
    if let Err(why) = cluster_tests::powerfs::available() {
        panic!("the power-loss campaign puts every member's data dir on powerfs: {why}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config(dir.path(), seed, power_schedule());
    c.rkube_args = rkube_args.iter().map(|a| a.to_string()).collect();
    let (dir, summary) = run(dir, c).await;
    println!("{}", summary.table());
    // Every cut of the schedule, unless the campaign stopped at one the cluster never
    // recovered from.
    let stopped = summary.faults.last().is_some_and(|f| !f.recovered);
    assert!(
        stopped || summary.faults.len() == power_schedule().len(),
        "one round injects every power cut of the schedule"
    );
    for f in &summary.faults {
        assert!(
            f.injected,
            "{} was not injected: {}",
            f.fault.name(),
            f.detail
        );
        assert!(
            !f.cuts.is_empty(),
            "{} cut nobody's power: {}",
            f.fault.name(),
            f.detail
        );
    }
    (dir, summary)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_power_loss_campaign_loses_no_acknowledged_write() {
    let (_turn, _) = cluster_tests::exclusive_ports(0);
    let seed = seed_or(20261205);
    let (dir, summary) = power_campaign(seed, &[]).await;
    if !summary.passed() {
        let kept = dir.keep();
        panic!(
            "the power-loss campaign failed (seed {seed}; members' logs and histories kept in \
             {}):\n{}",
            kept.display(),
            summary.table()
        );
    }
}

/// The same campaign against members that acknowledge before their log is on disk
/// (`--unsafe-no-fsync`) must fail on durability: acknowledged writes missing from the final
/// state, or a cluster that never comes back from a power cut (a store that finds its log
/// behind its own state machine may refuse to start, as rkube does today: its log lost what
/// it had acknowledged). Cutting all three right after an acknowledgement loses what was
/// written since the state machines' last sync (they are synced once a second), twice over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_power_loss_campaign_catches_a_store_that_does_not_sync() {
    let (_turn, _) = cluster_tests::exclusive_ports(0);
    let seed = seed_or(20261205);
    let (_dir, summary) = power_campaign(seed, &["--unsafe-no-fsync"]).await;
    assert!(
        !summary.passed(),
        "a campaign against members that do not sync passed:\n{}",
        summary.table()
    );
    let lost = !summary.lost.is_empty();
    let never_back = summary.final_state.is_err()
        || summary
            .faults
            .iter()
            .any(|f| f.fault.is_power_cut() && !f.recovered);
    assert!(
        lost || never_back,
        "the campaign failed, but neither on lost acknowledged writes nor on a cluster that \
         never came back from a power cut (seed {seed}):\n{}",
        summary.table()
    );
}
