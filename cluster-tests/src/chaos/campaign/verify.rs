//! After the faults: the final state read back, and every member holding the same keys and
//! history at one revision.

use super::*;

impl Run {
    /// After the campaign: every member reaches the leader's revision and has the same
    /// HashKV (hash and compaction revision) there. What they agree on, or where they differ.
    pub(super) async fn members_agree(&self) -> Result<String, String> {
        let l = self
            .wait_leader_except(None, RECOVERY_BOUND)
            .await
            .ok_or("no leader to take the revision from")?;
        let head = self
            .sys
            .status(l)
            .await
            .and_then(|s| s.header)
            .map(|h| h.revision)
            .ok_or_else(|| format!("leader m{l} did not answer a status request"))?;
        let mut hashes = Vec::new();
        for m in 0..self.sys.size() {
            if self.wait_caught_up(m, head, RECOVERY_BOUND).await.is_none() {
                return Err(format!(
                    "m{m} did not reach revision {head} within {RECOVERY_BOUND:?}"
                ));
            }
            let mut mc = pb::maintenance_client::MaintenanceClient::new(self.sys.channel(m));
            let call = mc.hash_kv(pb::HashKvRequest { revision: head });
            match tokio::time::timeout(Duration::from_secs(10), call).await {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    hashes.push((m, r.hash, r.compact_revision));
                }
                Ok(Err(e)) => return Err(format!("m{m}: HashKV at {head}: {}", e.message())),
                Err(_) => return Err(format!("m{m} did not answer HashKV at {head} in 10 s")),
            }
        }
        let (m0, hash, compacted) = hashes[0];
        match hashes
            .iter()
            .find(|(_, h, c)| (*h, *c) != (hash, compacted))
        {
            None => Ok(format!(
                "hash {hash:08x} at revision {head} (compacted at {compacted})"
            )),
            Some((m, h, c)) => Err(format!(
                "at revision {head} m{m0} has hash {hash:08x} (compacted at {compacted}) \
                 and m{m} has {h:08x} (compacted at {c})"
            )),
        }
    }

    pub(super) async fn head_revision_of(&self, m: usize) -> Option<i64> {
        match self.sys.status(m).await {
            Some(s) => s.header.map(|h| h.revision),
            None => self.head_revision().await,
        }
    }

    /// After the campaign: one linearizable read of every register and of the transaction
    /// keys (recorded in the history, so that lost register writes show as violations) and the
    /// appends found.
    pub(super) async fn final_reads(&self) -> Result<HashSet<String>> {
        let l = self
            .wait_leader_except(None, RECOVERY_BOUND)
            .await
            .context("no leader after healing")?;
        let mut kv = pb::kv_client::KvClient::new(self.sys.channel(l));
        for k in 0..workload::REGISTERS {
            let key = workload::register_key(k);
            let call = self.rec.now();
            let r = kv
                .range(pb::RangeRequest {
                    key: key.clone().into(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let got = r
                .kvs
                .first()
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned());
            lock(&self.rec.ops).push(Op {
                client: usize::MAX - k,
                call,
                ret: Some(self.rec.now()),
                keys: vec![key],
                kind: OpKind::Read { got: vec![got] },
            });
        }
        let prefix = b"ack/".to_vec();
        let r = kv
            .range(pb::RangeRequest {
                key: prefix.clone(),
                range_end: rkube_store::mvcc::prefix_end(&prefix),
                keys_only: true,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.kvs
            .iter()
            .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
            .collect())
    }
}
