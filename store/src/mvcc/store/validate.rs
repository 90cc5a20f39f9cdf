//! Checks of a transaction before it is proposed, as etcd makes them.

use super::*;

/// Checks a transaction before it is proposed, as etcd does (`checkTxnRequest`, then
/// `checkIntervals` on each branch): op counts, empty keys, and keys written twice on one path.
pub fn validate_txn(txn: &TxnRequest) -> Result<(), MvccError> {
    check_requests(txn)?;
    check_intervals(&txn.success)?;
    check_intervals(&txn.failure)?;
    Ok(())
}

pub(super) fn check_requests(txn: &TxnRequest) -> Result<(), MvccError> {
    if txn.compare.len() > MAX_TXN_OPS
        || txn.success.len() > MAX_TXN_OPS
        || txn.failure.len() > MAX_TXN_OPS
    {
        return Err(MvccError::TooManyOps);
    }
    if txn.compare.iter().any(|c| c.range.key.is_empty()) {
        return Err(MvccError::EmptyKey);
    }
    for op in txn.success.iter().chain(&txn.failure) {
        match op {
            Op::Put(p) => {
                if p.key.is_empty() {
                    return Err(MvccError::EmptyKey);
                }
                if p.ignore_value && !p.value.is_empty() {
                    return Err(MvccError::ValueProvided);
                }
                if p.ignore_lease && p.lease != 0 {
                    return Err(MvccError::LeaseProvided);
                }
            }
            Op::Range(r) if r.range.key.is_empty() => return Err(MvccError::EmptyKey),
            Op::Delete(d) if d.range.key.is_empty() => return Err(MvccError::EmptyKey),
            Op::Txn(t) => check_requests(t)?,
            _ => {}
        }
    }
    Ok(())
}

/// Whether a delete of `range` overlaps a put of `key`, with the intervals of etcd's
/// `checkIntervals`: a `range_end` of `"\0"` makes an empty interval there, so etcd lets a
/// from-key delete and a put share a transaction, and so do we.
pub(super) fn deletes(range: &KeyRange, key: &[u8]) -> bool {
    if range.range_end.is_empty() {
        range.key.as_slice() == key
    } else {
        range.key.as_slice() <= key && key < range.range_end.as_slice()
    }
}

/// The keys put and the ranges deleted along `ops` (etcd's `checkIntervals`). A key may be
/// written once on a path: put twice, or put and deleted, is a duplicate. The two branches of a
/// nested transaction exclude each other, so they may write the same key.
pub(super) fn check_intervals(ops: &[Op]) -> Result<(BTreeSet<&[u8]>, Vec<&KeyRange>), MvccError> {
    let mut dels: Vec<&KeyRange> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Delete(d) => Some(&d.range),
            _ => None,
        })
        .collect();
    let deleted = |dels: &[&KeyRange], key: &[u8]| dels.iter().any(|r| deletes(r, key));
    let mut puts: BTreeSet<&[u8]> = BTreeSet::new();
    for op in ops {
        let Op::Txn(t) = op else { continue };
        let (puts_then, dels_then) = check_intervals(&t.success)?;
        let (puts_else, dels_else) = check_intervals(&t.failure)?;
        for &key in &puts_then {
            if puts.contains(key) || deleted(&dels, key) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(key);
        }
        for key in puts_else {
            if (puts.contains(key) && !puts_then.contains(key)) || deleted(&dels, key) {
                return Err(MvccError::DuplicateKey);
            }
            puts.insert(key);
        }
        dels.extend(dels_then);
        dels.extend(dels_else);
    }
    for op in ops {
        let Op::Put(p) = op else { continue };
        if puts.contains(p.key.as_slice()) || deleted(&dels, &p.key) {
            return Err(MvccError::DuplicateKey);
        }
        puts.insert(&p.key);
    }
    Ok((puts, dels))
}
