//! The leader's housekeeping of the store's history, as kube-apiserver's compactor does it:
//! every interval (5 minutes by default) compact to the revision recorded one interval ago, so
//! a watcher can always resume from any revision of the last interval.

use std::sync::Arc;
use std::time::Duration;

use rkube_store::mvcc::Command;
use rkube_store::server::node::Node;
use tokio::sync::watch;

pub fn run(node: Arc<Node>, term: u64, interval: Duration, mut stop: watch::Receiver<bool>) {
    if interval.is_zero() {
        return;
    }
    tokio::spawn(async move {
        // The revision seen at the previous tick: the next compaction point.
        let mut previous: Option<i64> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if let Some(revision) = previous {
                if revision > node.mvcc.compact_revision() {
                    match node
                        .propose_fenced(Command::Compact { revision }, term)
                        .await
                    {
                        Ok(_) => tracing::info!(revision, "compacted the store's history"),
                        Err(e) => tracing::warn!(error = %e, revision, "compaction failed"),
                    }
                }
            }
            previous = Some(node.mvcc.revision());
        }
    });
}
