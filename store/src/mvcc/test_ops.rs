//! Commands for tests of the store's users (backups, interchange): a transaction of puts and
//! deletes applied on its own.

use super::{Command, MvccStore, Op, PutRequest, TxnRequest};

/// Applies `ops` as one transaction.
pub fn txn(store: &MvccStore, ops: Vec<Op>) {
    store
        .apply(
            &Command::Txn(TxnRequest {
                compare: vec![],
                success: ops,
                failure: vec![],
            }),
            vec![],
        )
        .expect("apply");
}

/// A put of `value` under `key` with `lease` (0: none).
pub fn put(key: &str, value: &str, lease: i64) -> Op {
    Op::Put(PutRequest {
        key: key.into(),
        value: value.into(),
        lease,
        ..Default::default()
    })
}
