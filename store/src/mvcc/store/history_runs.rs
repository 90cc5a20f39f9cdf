//! The history tree's values: one record under its own revision, or a run of the records of
//! consecutive revisions of one commit under the first of them.
//!
//! sled splits a leaf once it holds more than sixteen values, and a commit's records all go
//! to the tree's rightmost leaf, so one sled value per record made a DeleteRange of 220,000
//! keys split a leaf every eight records and walk the tree from its root 220,000 times: seven
//! seconds per member, past the request timeout. Runs of up to [`RUN_BYTES`] make a third of
//! the sled writes for records of 300 bytes, and that delete takes half the time. Runs never
//! span commits, so a run never holds a revision later than a key that follows it in the
//! tree.
//!
//! A run's layout: [`RUN_MAGIC`], the number of records (u32), then per record its main and
//! sub revision (i64) and where its bytes end (u32), all little endian, then the records,
//! encoded as a lone record is. A lone record begins with its key's length (u64), which is
//! never [`RUN_MAGIC`]. How a commit groups its records depends on how the commands were
//! batched, which differs between members: HashKV, backups in etcd's format and the key count
//! read the records one by one, never the runs. Raft snapshots copy the values as they are
//! (dump format version 2), and a restore groups the records again into runs of its own size
//! (`RESTORE_RUN_BYTES`), across commits: it writes the whole history at once.

use super::*;

/// Marks a run: a key length no record can have.
const RUN_MAGIC: [u8; 8] = [0xff; 8];
/// A record is added to a run while the run stays within this many bytes. Larger runs are
/// faster still and cost memory: sled copies the whole leaf on every insert and frees the
/// copies late, so with runs of 6 KiB that DeleteRange took 1.0-1.3 s instead of 1.75-1.9 s
/// and raised each member's peak RSS by about 150 MiB more (2026-12-07; `etcdctl check perf
/// --load=l` peaked at 1.10x etcd's RSS with 2 KiB, 0.77x with 1 KiB).
pub(super) const RUN_BYTES: usize = 1024;
const HEAD: usize = RUN_MAGIC.len() + 4;
const ENTRY: usize = 8 + 8 + 4;

/// Encodes `records` (in revision order) as one history value: the lone record, or a run.
/// A lone record is moved, not copied: it is the usual put, on the commit path.
pub(super) fn encode_value(mut records: Vec<(Revision, Vec<u8>)>) -> Vec<u8> {
    match records.len() {
        1 => records.pop().map(|(_, one)| one).unwrap_or_default(),
        _ => run_value(&records),
    }
}

/// `records` (in revision order) as a run, even a single one (what is left of a run after a
/// compaction stays a run under the run's key).
fn run_value(records: &[(Revision, Vec<u8>)]) -> Vec<u8> {
    let body: usize = records.iter().map(|(_, r)| r.len()).sum();
    let mut out = Vec::with_capacity(HEAD + ENTRY * records.len() + body);
    out.extend_from_slice(&RUN_MAGIC);
    out.extend_from_slice(&(records.len() as u32).to_le_bytes());
    let mut end = 0usize;
    for (rev, r) in records {
        end += r.len();
        out.extend_from_slice(&rev.main.to_le_bytes());
        out.extend_from_slice(&rev.sub.to_le_bytes());
        out.extend_from_slice(&(end as u32).to_le_bytes());
    }
    for (_, r) in records {
        out.extend_from_slice(r);
    }
    out
}

/// A history value read from the tree: its records with their revisions.
pub(super) struct HistValue<V> {
    /// The revision it is stored under.
    key: Revision,
    value: V,
    kind: Kind,
}

enum Kind {
    /// A lone record, whose revision is its key.
    One,
    /// A run of `count` records.
    Run { count: usize },
}

impl<V: AsRef<[u8]>> HistValue<V> {
    /// Reads the value stored under `key`, checking a run's layout.
    pub(super) fn parse(key: &[u8], value: V) -> Result<Self, StorageError> {
        let corrupt = |what: &str| StorageError::Corrupt(format!("history {what}"));
        let key = Revision::from_bytes(key).ok_or_else(|| corrupt("key"))?;
        let bytes = value.as_ref();
        if !bytes.starts_with(&RUN_MAGIC) {
            return Ok(Self {
                key,
                value,
                kind: Kind::One,
            });
        }
        let count = bytes
            .get(RUN_MAGIC.len()..HEAD)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default()) as usize)
            .ok_or_else(|| corrupt("run header"))?;
        let body = count
            .checked_mul(ENTRY)
            .and_then(|e| e.checked_add(HEAD))
            .filter(|b| *b <= bytes.len())
            .ok_or_else(|| corrupt("run header"))?;
        let run = Self {
            key,
            value,
            kind: Kind::Run { count },
        };
        // Revisions ascend from the key (the first one differs after a compaction dropped
        // it), and each record ends at or after the one before it.
        let mut last_end = 0;
        let mut last_rev = None;
        for i in 0..count {
            let (rev, end) = run.entry(i);
            let ascending = last_rev.map_or(rev >= key, |last| rev > last);
            if !ascending || end < last_end || body + end > run.value.as_ref().len() {
                return Err(corrupt("run entry"));
            }
            last_end = end;
            last_rev = Some(rev);
        }
        if count == 0 || body + last_end != run.value.as_ref().len() {
            return Err(corrupt("run length"));
        }
        Ok(run)
    }

    /// The `i`th entry of a run: its revision and where its record's bytes end.
    fn entry(&self, i: usize) -> (Revision, usize) {
        let at = HEAD + i * ENTRY;
        let b = &self.value.as_ref()[at..at + ENTRY];
        let int =
            |r: std::ops::Range<usize>| i64::from_le_bytes(b[r].try_into().unwrap_or_default());
        let rev = Revision {
            main: int(0..8),
            sub: int(8..16),
        };
        (
            rev,
            u32::from_le_bytes(b[16..20].try_into().unwrap_or_default()) as usize,
        )
    }

    /// How many records the value holds.
    pub(super) fn len(&self) -> usize {
        match self.kind {
            Kind::One => 1,
            Kind::Run { count } => count,
        }
    }

    /// The `i`th record (`i < len()`) and its revision.
    pub(super) fn get(&self, i: usize) -> (Revision, &[u8]) {
        match self.kind {
            Kind::One => (self.key, self.value.as_ref()),
            Kind::Run { count } => {
                let body = HEAD + count * ENTRY;
                let start = if i == 0 { 0 } else { self.entry(i - 1).1 };
                let (rev, end) = self.entry(i);
                (rev, &self.value.as_ref()[body + start..body + end])
            }
        }
    }

    /// The records in revision order.
    pub(super) fn records(&self) -> impl Iterator<Item = (Revision, &[u8])> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The records of revisions in `from..to`, in revision order.
    pub(super) fn records_in(
        &self,
        from: Revision,
        to: Revision,
    ) -> impl Iterator<Item = (Revision, &[u8])> + '_ {
        self.records()
            .skip_while(move |(rev, _)| *rev < from)
            .take_while(move |(rev, _)| *rev < to)
    }

    /// The record of revision `rev`, if the value holds it.
    pub(super) fn find(&self, rev: Revision) -> Option<&[u8]> {
        match self.kind {
            Kind::One => (self.key == rev).then(|| self.value.as_ref()),
            Kind::Run { count } => {
                let (mut lo, mut hi) = (0, count);
                while lo < hi {
                    let mid = (lo + hi) / 2;
                    match self.entry(mid).0.cmp(&rev) {
                        std::cmp::Ordering::Less => lo = mid + 1,
                        std::cmp::Ordering::Greater => hi = mid,
                        std::cmp::Ordering::Equal => return Some(self.get(mid).1),
                    }
                }
                None
            }
        }
    }

    /// The last revision the value holds.
    fn last(&self) -> Revision {
        self.get(self.len() - 1).0
    }
}

/// Groups a commit's encoded records (in revision order) into history values: runs of up to
/// [`RUN_BYTES`], each under its first revision. A record larger than that stays alone.
pub(super) fn group_records(
    mut records: impl Iterator<Item = (Revision, Vec<u8>)>,
) -> impl Iterator<Item = (Revision, Vec<u8>)> {
    let mut runs = Runs::new(RUN_BYTES);
    std::iter::from_fn(move || loop {
        match records.next() {
            Some((rev, record)) => {
                if let Some(value) = runs.push(rev, record) {
                    return Some(value);
                }
            }
            None => return runs.finish(),
        }
    })
}

/// Records of consecutive revisions grouped into history values as they come: runs of up to
/// `limit` bytes, each under its first revision; a record larger than that stays alone.
pub(super) struct Runs {
    limit: usize,
    records: Vec<(Revision, Vec<u8>)>,
    /// The run's bytes after its head.
    bytes: usize,
}

impl Runs {
    pub(super) fn new(limit: usize) -> Self {
        Runs {
            limit,
            records: Vec::new(),
            bytes: 0,
        }
    }

    /// Adds the next record (in revision order); returns the value in progress if the record
    /// does not fit in it.
    pub(super) fn push(&mut self, rev: Revision, record: Vec<u8>) -> Option<(Revision, Vec<u8>)> {
        let full =
            !self.records.is_empty() && HEAD + self.bytes + ENTRY + record.len() > self.limit;
        let closed = if full { self.finish() } else { None };
        self.bytes += ENTRY + record.len();
        self.records.push((rev, record));
        closed
    }

    /// The value in progress, if any, under its first revision.
    pub(super) fn finish(&mut self) -> Option<(Revision, Vec<u8>)> {
        let first = self.records.first()?.0;
        self.bytes = 0;
        Some((first, encode_value(std::mem::take(&mut self.records))))
    }
}

/// The history value holding `rev`, if any: the value under `rev`, or the run before it.
fn value_holding(
    tree: &sled::Tree,
    rev: Revision,
) -> Result<Option<HistValue<sled::IVec>>, StorageError> {
    let key = rev.to_bytes();
    if let Some(v) = tree.get(key)? {
        return HistValue::parse(&key, v).map(Some);
    }
    match tree.range(..key).next_back() {
        Some(item) => {
            let (k, v) = item?;
            let value = HistValue::parse(&k, v)?;
            Ok((value.last() >= rev).then_some(value))
        }
        None => Ok(None),
    }
}

/// Reads history records by revision, keeping the last value it read: records read in
/// revision order mostly come from the run read before.
pub(super) struct HistReader<'a> {
    tree: &'a sled::Tree,
    last: Option<HistValue<sled::IVec>>,
}

impl<'a> HistReader<'a> {
    pub(super) fn new(tree: &'a sled::Tree) -> Self {
        Self { tree, last: None }
    }

    /// The encoded record of revision `rev`, if the history holds it.
    pub(super) fn get(&mut self, rev: Revision) -> Result<Option<&[u8]>, StorageError> {
        if self.last.as_ref().is_none_or(|v| v.find(rev).is_none()) {
            self.last = value_holding(self.tree, rev)?;
        }
        Ok(self.last.as_ref().and_then(|v| v.find(rev)))
    }
}

/// The history values that hold records of revisions in `from..to`, in revision order
/// (see [`HistValue::records_in`] for the records themselves).
pub(super) fn values_in(
    tree: &sled::Tree,
    from: Revision,
    to: Revision,
) -> impl Iterator<Item = Result<HistValue<sled::IVec>, StorageError>> + '_ {
    let from_key = from.to_bytes();
    // A run under an earlier key can hold revisions from `from` on.
    let before = tree.range(..from_key).next_back();
    before
        .into_iter()
        .chain(tree.range(from_key..to.to_bytes()))
        .map(|item| {
            let (k, v) = item?;
            HistValue::parse(&k, v)
        })
}

/// Removes the records of `revs` from the history in one batch: a lone record's value, a run
/// rewritten without them (under the same key), or removed once it holds none.
pub(super) fn remove_records(
    tree: &sled::Tree,
    mut revs: Vec<Revision>,
) -> Result<(), StorageError> {
    revs.sort_unstable();
    let mut batch = sled::Batch::default();
    let mut revs = revs.into_iter().peekable();
    while let Some(rev) = revs.next() {
        let Some(value) = value_holding(tree, rev)? else {
            continue;
        };
        let key = value.key.to_bytes();
        if let Kind::One = value.kind {
            batch.remove(&key);
            continue;
        }
        let last = value.last();
        let mut gone = vec![rev];
        while let Some(next) = revs.next_if(|r| *r <= last) {
            gone.push(next);
        }
        let kept: Vec<(Revision, Vec<u8>)> = value
            .records()
            .filter(|(r, _)| gone.binary_search(r).is_err())
            .map(|(r, bytes)| (r, bytes.to_vec()))
            .collect();
        match kept.as_slice() {
            [] => batch.remove(&key),
            // A run stays under its key: a lone record under another revision would need
            // its own key, and this keeps the batch to one write per value.
            _ => batch.insert(&key, run_value(&kept)),
        }
    }
    tree.apply_batch(batch)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }

    /// An encoded record of `len` bytes that names its revision.
    fn record(r: Revision, len: usize) -> Vec<u8> {
        let mut out = format!("{}/{}:", r.main, r.sub).into_bytes();
        out.resize(len.max(out.len()), b'.');
        out
    }

    fn tree() -> sled::Tree {
        let db = sled::Config::new().temporary(true).open().expect("db");
        db.open_tree("hist").expect("tree")
    }

    /// Writes the records of `revs` (one commit) as a commit groups them.
    fn commit(tree: &sled::Tree, revs: &[Revision], len: usize) -> usize {
        let values: Vec<_> = group_records(revs.iter().map(|r| (*r, record(*r, len)))).collect();
        for (key, value) in &values {
            tree.insert(key.to_bytes(), value.clone()).expect("insert");
        }
        values.len()
    }

    fn all(tree: &sled::Tree, from: Revision, to: Revision) -> Vec<(Revision, Vec<u8>)> {
        values_in(tree, from, to)
            .flat_map(|v| {
                let v = v.expect("value");
                v.records_in(from, to)
                    .map(|(r, b)| (r, b.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    #[test]
    fn a_commit_s_records_are_grouped_into_runs_within_the_byte_bound() {
        let t = tree();
        // A DeleteRange of 1,000 keys: one revision, 1,000 records of 300 bytes.
        let big: Vec<Revision> = (0..1000).map(|s| rev(7, s)).collect();
        let values = commit(&t, &big, 300);
        assert!(
            values <= 1000 * (300 + ENTRY) / (RUN_BYTES - 300) + 1,
            "{values} values"
        );
        assert!(values >= 1000 * 300 / RUN_BYTES, "{values} values");
        for item in t.iter() {
            let (_, v) = item.expect("row");
            assert!(v.len() <= RUN_BYTES, "a run of {} bytes", v.len());
        }
        // A lone record is stored as it was before runs: under its revision, unchanged.
        assert_eq!(commit(&t, &[rev(8, 0)], 40), 1);
        assert_eq!(
            t.get(rev(8, 0).to_bytes()).expect("get").as_deref(),
            Some(&record(rev(8, 0), 40)[..])
        );
        // A record larger than a run stays alone, between runs of the same commit.
        let revs: Vec<Revision> = (0..5).map(|s| rev(9, s)).collect();
        let grouped: Vec<_> = group_records(
            revs.iter()
                .map(|r| (*r, record(*r, if r.sub == 2 { RUN_BYTES * 2 } else { 100 }))),
        )
        .map(|(r, _)| r)
        .collect();
        assert_eq!(grouped, vec![rev(9, 0), rev(9, 2), rev(9, 3)]);

        // Every record reads back by revision, in any order, and in ranges from inside a run.
        let mut reader = HistReader::new(&t);
        for r in big.iter().rev().chain([rev(8, 0)].iter()) {
            let len = if r.main == 8 { 40 } else { 300 };
            assert_eq!(
                reader.get(*r).expect("get"),
                Some(&record(*r, len)[..]),
                "{r:?}"
            );
        }
        assert_eq!(reader.get(rev(7, 1000)).expect("get"), None);
        assert_eq!(reader.get(rev(6, 0)).expect("get"), None);
        assert_eq!(reader.get(rev(8, 1)).expect("get"), None);
        let got = all(&t, rev(7, 333), rev(8, 1));
        let want: Vec<Revision> = (333..1000).map(|s| rev(7, s)).chain([rev(8, 0)]).collect();
        assert_eq!(got.iter().map(|(r, _)| *r).collect::<Vec<_>>(), want);
        assert!(got
            .iter()
            .all(|(r, b)| b.starts_with(format!("{}/{}:", r.main, r.sub).as_bytes())));
        assert!(all(&t, rev(7, 5), rev(7, 5)).is_empty());
    }

    #[test]
    fn removing_records_rewrites_or_drops_their_runs() {
        let t = tree();
        let revs: Vec<Revision> = (0..100).map(|s| rev(3, s)).collect();
        commit(&t, &revs, 200);
        commit(&t, &[rev(4, 0)], 10);
        let runs = t.len();
        assert!(runs > 2);
        // Drop every record but each tenth, the run keys' own records among them, and the
        // lone record.
        let gone: Vec<Revision> = revs
            .iter()
            .copied()
            .filter(|r| r.sub % 10 != 0)
            .chain([rev(4, 0)])
            .collect();
        remove_records(&t, gone.clone()).expect("remove");
        let left: Vec<Revision> = all(&t, rev(0, 0), rev(9, 0))
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(left, (0..10).map(|s| rev(3, s * 10)).collect::<Vec<_>>());
        assert!(t.len() < runs);
        let mut reader = HistReader::new(&t);
        for r in &gone {
            assert_eq!(reader.get(*r).expect("get"), None, "{r:?}");
        }
        for r in &left {
            assert_eq!(reader.get(*r).expect("get"), Some(&record(*r, 200)[..]));
        }
        // Removing again changes nothing; removing the rest leaves nothing.
        remove_records(&t, gone).expect("remove again");
        assert_eq!(all(&t, rev(0, 0), rev(9, 0)).len(), 10);
        remove_records(&t, left).expect("remove the rest");
        assert!(t.is_empty());
    }

    #[test]
    fn a_damaged_run_is_refused() {
        let records: Vec<(Revision, Vec<u8>)> =
            (0..3).map(|s| (rev(5, s), record(rev(5, s), 30))).collect();
        let good = encode_value(records.clone());
        let key = rev(5, 0).to_bytes();
        assert_eq!(HistValue::parse(&key, &good[..]).expect("parses").len(), 3);
        // Cut short, one byte too many, a count past the end, a key after its first record,
        // revisions out of order.
        assert!(HistValue::parse(&key, &good[..good.len() - 1]).is_err());
        let mut long = good.clone();
        long.push(0);
        assert!(HistValue::parse(&key, &long[..]).is_err());
        let mut count = good.clone();
        count[8..12].copy_from_slice(&1000u32.to_le_bytes());
        assert!(HistValue::parse(&key, &count[..]).is_err());
        assert!(HistValue::parse(&rev(5, 1).to_bytes(), &good[..]).is_err());
        let mut swapped = records.clone();
        swapped.swap(0, 1);
        assert!(HistValue::parse(&key, &encode_value(swapped)[..]).is_err());
        assert!(HistValue::parse(&key[..15], &good[..]).is_err());
    }
}
