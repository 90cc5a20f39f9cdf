//! The key index: for every key, the revisions of it that the history still holds, in memory
//! (etcd's treeIndex does the same job).
//!
//! The history (`hist`, revision -> record) is the only per-key thing the store writes; the
//! index is rebuilt from it when the store opens ([`KeyIndex::record`] for each record in
//! revision order) and after a snapshot is installed. A read finds the revision of each key's
//! version here and then reads that record from the history.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use super::keys::Revision;

/// Where one version of a key is in the history, and what a delete of it needs to know
/// without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Version {
    pub(super) rev: Revision,
    pub(super) tombstone: bool,
    /// The lease the version is attached to (0: none).
    pub(super) lease: i64,
}

/// The versions of one key in the history, oldest first.
type Versions = Vec<Version>;

#[derive(Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct KeyIndex {
    /// Each key once, shared with the events and staged changes that name it.
    keys: BTreeMap<Bytes, Versions>,
}

/// The version live at main revision `at`: the newest at or before it, unless that one is a
/// deletion.
fn live_at(versions: &Versions, at: i64) -> Option<Version> {
    let i = versions.partition_point(|v| v.rev.main <= at);
    let version = *versions.get(i.checked_sub(1)?)?;
    (!version.tombstone).then_some(version)
}

impl KeyIndex {
    pub(super) fn clear(&mut self) {
        self.keys.clear();
    }

    /// Adds a history record of `key`, newer than every record of it so far.
    pub(super) fn record(&mut self, key: &Bytes, version: Version) {
        self.record_with(key, version, || key.clone());
    }

    /// [`KeyIndex::record`] for a key read from the history, copied only when it is new.
    pub(super) fn record_read(&mut self, key: &[u8], version: Version) {
        self.record_with(key, version, || Bytes::copy_from_slice(key));
    }

    fn record_with(&mut self, key: &[u8], version: Version, owned: impl FnOnce() -> Bytes) {
        match self.keys.get_mut(key) {
            Some(versions) => versions.push(version),
            None => {
                self.keys.insert(owned(), vec![version]);
            }
        }
    }

    /// `key`'s version live at main revision `at`.
    pub(super) fn at(&self, key: &[u8], at: i64) -> Option<Version> {
        live_at(self.keys.get(key)?, at)
    }

    /// The revision of `key`'s version live just before `before`.
    pub(super) fn before(&self, key: &[u8], before: Revision) -> Option<Revision> {
        let versions = self.keys.get(key)?;
        let i = versions.partition_point(|v| v.rev < before);
        let version = *versions.get(i.checked_sub(1)?)?;
        (!version.tombstone).then_some(version.rev)
    }

    /// The keys in `[start, end)` (to the last key when `end` is `None`) live at main revision
    /// `at`, in key order, with their version then.
    pub(super) fn range<'a>(
        &'a self,
        start: &[u8],
        end: Option<&[u8]>,
        at: i64,
    ) -> impl Iterator<Item = (&'a Bytes, Version)> + 'a {
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        // BTreeMap::range panics on an end before its start.
        let empty = end.is_some_and(|end| end <= start);
        let iter = (!empty).then(|| self.keys.range::<[u8], _>((Bound::Included(start), upper)));
        iter.into_iter()
            .flatten()
            .filter_map(move |(key, versions)| Some((key, live_at(versions, at)?)))
    }

    /// Forgets what a compaction at `revision` drops from the history, and returns the
    /// revisions of those records: for every key, each record at or before `revision` except
    /// the newest one, and that one too when it is a deletion.
    pub(super) fn compact(&mut self, revision: i64) -> Vec<Revision> {
        let mut dropped = Vec::new();
        self.keys.retain(|_, versions| {
            let upto = versions.partition_point(|v| v.rev.main <= revision);
            if upto == 0 {
                return true;
            }
            let keep_newest = !versions[upto - 1].tombstone;
            let drop = if keep_newest { upto - 1 } else { upto };
            dropped.extend(versions.drain(..drop).map(|v| v.rev));
            !versions.is_empty()
        });
        dropped.sort_unstable();
        dropped
    }

    /// How many keys are live at the newest revision.
    #[cfg(test)]
    pub(super) fn live_keys(&self) -> usize {
        self.keys
            .values()
            .filter(|versions| versions.last().is_some_and(|v| !v.tombstone))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(main: i64, sub: i64) -> Revision {
        Revision { main, sub }
    }

    fn index(records: &[(&str, i64, bool)]) -> KeyIndex {
        let mut index = KeyIndex::default();
        for (key, main, tombstone) in records {
            let version = Version {
                rev: rev(*main, 0),
                tombstone: *tombstone,
                lease: 0,
            };
            index.record_read(key.as_bytes(), version);
        }
        index
    }

    #[test]
    fn reads_a_key_at_each_revision() {
        let index = index(&[("a", 2, false), ("a", 4, true), ("a", 6, false)]);
        let at = |main| index.at(b"a", main).map(|v| v.rev.main);
        assert_eq!(
            [1, 2, 3, 4, 5, 6, 9].map(at),
            [None, Some(2), Some(2), None, None, Some(6), Some(6)]
        );
        assert_eq!(index.before(b"a", rev(6, 0)), None);
        assert_eq!(index.before(b"a", rev(4, 0)), Some(rev(2, 0)));
        assert_eq!(index.before(b"a", rev(2, 0)), None);
        assert_eq!(index.at(b"b", 9), None);
    }

    #[test]
    fn ranges_over_keys_live_at_a_revision() {
        let index = index(&[
            ("a", 1, false),
            ("b", 2, false),
            ("c", 3, false),
            ("b", 4, true),
            ("d", 5, false),
        ]);
        let keys = |start: &str, end: Option<&str>, at| {
            index
                .range(start.as_bytes(), end.map(str::as_bytes), at)
                .map(|(k, v)| (String::from_utf8(k.to_vec()).expect("utf-8"), v.rev.main))
                .collect::<Vec<_>>()
        };
        let owned = |v: &[(&str, i64)]| {
            v.iter()
                .map(|(k, r)| (k.to_string(), *r))
                .collect::<Vec<_>>()
        };
        assert_eq!(keys("a", None, 9), owned(&[("a", 1), ("c", 3), ("d", 5)]));
        assert_eq!(keys("a", Some("c"), 3), owned(&[("a", 1), ("b", 2)]));
        assert_eq!(keys("b", Some("b"), 9), owned(&[]));
        assert_eq!(keys("c", Some("a"), 9), owned(&[]));
        assert_eq!(keys("a", None, 0), owned(&[]));
    }

    #[test]
    fn a_compaction_keeps_each_key_as_it_was_at_the_compacted_revision() {
        let mut index = index(&[
            ("a", 1, false),
            ("a", 2, false),
            ("b", 3, false),
            ("b", 4, true),
            ("c", 5, false),
            ("a", 6, false),
        ]);
        assert_eq!(index.compact(5), vec![rev(1, 0), rev(3, 0), rev(4, 0)]);
        let at = |key: &[u8], main| index.at(key, main).map(|v| v.rev);
        assert_eq!(at(b"a", 5), Some(rev(2, 0)));
        assert_eq!(at(b"a", 6), Some(rev(6, 0)));
        assert_eq!(at(b"b", 5), None);
        assert_eq!(at(b"c", 5), Some(rev(5, 0)));
        assert_eq!(index.live_keys(), 2);
        // Again at the same revision: nothing more to drop.
        assert_eq!(index.compact(5), vec![]);
    }
}
