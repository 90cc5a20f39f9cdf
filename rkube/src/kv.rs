//! `rkube kv ...` and `rkube lease ...`: a small client of the store's etcd v3 API, printing
//! like etcdctl's simple format.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use futures::StreamExt;
use rkube_store::mvcc::prefix_end;
use rkube_store::proto::etcdserverpb as pb;
use rkube_store::proto::mvccpb;
use tonic::transport::Channel;

#[derive(Debug, Subcommand)]
pub enum KvCommand {
    /// Put a key.
    Put {
        key: String,
        value: String,
        /// Attach to this lease (hex ID, as `lease grant` prints it).
        #[arg(long)]
        lease: Option<String>,
        #[arg(long)]
        prev_kv: bool,
    },
    /// Get a key or a range.
    Get {
        key: String,
        /// Exclusive end of the range.
        range_end: Option<String>,
        #[arg(long)]
        prefix: bool,
        #[arg(long)]
        from_key: bool,
        #[arg(long, default_value_t = 0)]
        rev: i64,
        #[arg(long, default_value_t = 0)]
        limit: i64,
        #[arg(long)]
        keys_only: bool,
        #[arg(long)]
        count_only: bool,
        /// Local read on the member (may be stale) instead of a linearizable one.
        #[arg(long)]
        serializable: bool,
        /// Print each key's revisions too.
        #[arg(long)]
        verbose: bool,
    },
    /// Delete a key or a range.
    Del {
        key: String,
        range_end: Option<String>,
        #[arg(long)]
        prefix: bool,
        #[arg(long)]
        prev_kv: bool,
    },
    /// Watch a key or a range and print events until interrupted.
    Watch {
        key: String,
        range_end: Option<String>,
        #[arg(long)]
        prefix: bool,
        /// Start at this revision (replays history).
        #[arg(long, default_value_t = 0)]
        rev: i64,
        #[arg(long)]
        prev_kv: bool,
    },
    /// A transaction: `--if 'mod("k") = "5"' --then 'put k v' --else 'get k'`. Compares are
    /// value|version|create|mod|lease("key") with = != < >; ops are put KEY VALUE, get KEY, del KEY.
    Txn {
        #[arg(long = "if")]
        compares: Vec<String>,
        #[arg(long = "then")]
        success: Vec<String>,
        #[arg(long = "else")]
        failure: Vec<String>,
    },
    /// Compact history up to a revision.
    Compact { revision: i64 },
}

#[derive(Debug, Subcommand)]
pub enum LeaseCommand {
    /// Grant a lease with a TTL in seconds.
    Grant { ttl: i64 },
    /// Revoke a lease (deletes its keys).
    Revoke { id: String },
    /// Keep a lease alive until interrupted (or once).
    KeepAlive {
        id: String,
        #[arg(long)]
        once: bool,
    },
    /// Remaining TTL of a lease.
    Ttl {
        id: String,
        #[arg(long)]
        keys: bool,
    },
    /// List leases.
    List,
}

fn range_end_of(key: &str, end: Option<String>, prefix: bool, from_key: bool) -> Vec<u8> {
    if prefix {
        prefix_end(key.as_bytes())
    } else if from_key {
        vec![0]
    } else {
        end.map(String::into_bytes).unwrap_or_default()
    }
}

fn parse_lease(id: &str) -> Result<i64> {
    i64::from_str_radix(id.trim_start_matches("0x"), 16)
        .with_context(|| format!("{id:?} is not a hex lease ID"))
}

fn print_kv(kv: &mvccpb::KeyValue, keys_only: bool, verbose: bool) {
    println!("{}", String::from_utf8_lossy(&kv.key));
    if verbose {
        println!(
            "create_revision={} mod_revision={} version={} lease={:x}",
            kv.create_revision, kv.mod_revision, kv.version, kv.lease
        );
    }
    if !keys_only {
        println!("{}", String::from_utf8_lossy(&kv.value));
    }
}

fn status_err(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{}", s.message())
}

pub async fn run(ch: Channel, cmd: KvCommand) -> Result<()> {
    let mut kv = pb::kv_client::KvClient::new(ch.clone());
    match cmd {
        KvCommand::Put {
            key,
            value,
            lease,
            prev_kv,
        } => {
            let lease = lease.as_deref().map(parse_lease).transpose()?.unwrap_or(0);
            let resp = kv
                .put(pb::PutRequest {
                    key: key.into_bytes(),
                    value: value.into_bytes(),
                    lease,
                    prev_kv,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?
                .into_inner();
            println!("OK");
            if let Some(prev) = resp.prev_kv {
                print_kv(&prev, false, false);
            }
        }
        KvCommand::Get {
            key,
            range_end,
            prefix,
            from_key,
            rev,
            limit,
            keys_only,
            count_only,
            serializable,
            verbose,
        } => {
            let range_end = range_end_of(&key, range_end, prefix, from_key);
            let resp = kv
                .range(pb::RangeRequest {
                    key: key.into_bytes(),
                    range_end,
                    revision: rev,
                    limit,
                    keys_only,
                    count_only,
                    serializable,
                    ..Default::default()
                })
                .await
                .map_err(status_err)?
                .into_inner();
            if count_only {
                println!("{}", resp.count);
            }
            for item in &resp.kvs {
                print_kv(item, keys_only, verbose);
            }
            if verbose {
                println!(
                    "revision={} count={} more={}",
                    resp.header.map_or(0, |h| h.revision),
                    resp.count,
                    resp.more
                );
            }
        }
        KvCommand::Del {
            key,
            range_end,
            prefix,
            prev_kv,
        } => {
            let range_end = range_end_of(&key, range_end, prefix, false);
            let resp = kv
                .delete_range(pb::DeleteRangeRequest {
                    key: key.into_bytes(),
                    range_end,
                    prev_kv,
                })
                .await
                .map_err(status_err)?
                .into_inner();
            println!("{}", resp.deleted);
            for item in &resp.prev_kvs {
                print_kv(item, false, false);
            }
        }
        KvCommand::Watch {
            key,
            range_end,
            prefix,
            rev,
            prev_kv,
        } => {
            let range_end = range_end_of(&key, range_end, prefix, false);
            watch(ch, key.into_bytes(), range_end, rev, prev_kv).await?;
        }
        KvCommand::Txn {
            compares,
            success,
            failure,
        } => {
            let req = pb::TxnRequest {
                compare: compares
                    .iter()
                    .map(|c| parse_compare(c))
                    .collect::<Result<_>>()?,
                success: success.iter().map(|o| parse_op(o)).collect::<Result<_>>()?,
                failure: failure.iter().map(|o| parse_op(o)).collect::<Result<_>>()?,
            };
            let resp = kv.txn(req).await.map_err(status_err)?.into_inner();
            println!("{}", if resp.succeeded { "SUCCESS" } else { "FAILURE" });
            for r in resp.responses {
                use pb::response_op::Response as R;
                match r.response {
                    Some(R::ResponsePut(_)) => println!("\nOK"),
                    Some(R::ResponseDeleteRange(d)) => println!("\n{}", d.deleted),
                    Some(R::ResponseRange(g)) => {
                        println!();
                        for item in &g.kvs {
                            print_kv(item, false, false);
                        }
                    }
                    Some(R::ResponseTxn(_)) | None => {}
                }
            }
        }
        KvCommand::Compact { revision } => {
            kv.compact(pb::CompactionRequest {
                revision,
                physical: false,
            })
            .await
            .map_err(status_err)?;
            println!("compacted revision {revision}");
        }
    }
    Ok(())
}

async fn watch(
    ch: Channel,
    key: Vec<u8>,
    range_end: Vec<u8>,
    start_revision: i64,
    prev_kv: bool,
) -> Result<()> {
    let mut client = pb::watch_client::WatchClient::new(ch);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::WatchRequest {
        request_union: Some(pb::watch_request::RequestUnion::CreateRequest(
            pb::WatchCreateRequest {
                key,
                range_end,
                start_revision,
                prev_kv,
                ..Default::default()
            },
        )),
    })
    .await?;
    let mut stream = client
        .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(status_err)?
        .into_inner();
    while let Some(resp) = stream.next().await {
        let resp = resp.map_err(status_err)?;
        if resp.canceled {
            bail!("watch canceled: {}", resp.cancel_reason);
        }
        for e in resp.events {
            let kind = if e.r#type == mvccpb::event::EventType::Delete as i32 {
                "DELETE"
            } else {
                "PUT"
            };
            println!("{kind}");
            if let Some(p) = &e.prev_kv {
                print_kv(p, false, false);
            }
            if let Some(kv) = &e.kv {
                print_kv(kv, kind == "DELETE", false);
            }
        }
    }
    drop(tx);
    Ok(())
}

/// `mod("key") > "5"`, `value("k") = "v"`, `version("k") != "0"`, ...
fn parse_compare(s: &str) -> Result<pb::Compare> {
    use pb::compare::{CompareResult as R, CompareTarget as T, TargetUnion as U};
    let (target, rest) = s
        .split_once('(')
        .with_context(|| format!("bad compare {s:?}"))?;
    let (key, rest) = rest
        .split_once(')')
        .with_context(|| format!("bad compare {s:?}"))?;
    let key = key.trim().trim_matches('"').to_string();
    let rest = rest.trim();
    let (op, value) = ["!=", "=", "<", ">"]
        .iter()
        .find_map(|op| {
            rest.strip_prefix(op)
                .map(|v| (*op, v.trim().trim_matches('"').to_string()))
        })
        .with_context(|| format!("compare {s:?} needs one of = != < >"))?;
    let result = match op {
        "=" => R::Equal,
        "!=" => R::NotEqual,
        "<" => R::Less,
        _ => R::Greater,
    };
    let num = |v: &str| {
        v.parse::<i64>()
            .with_context(|| format!("{v:?} is not a number"))
    };
    let (t, u) = match target.trim() {
        "value" | "val" => (T::Value, U::Value(value.into_bytes())),
        "version" | "ver" => (T::Version, U::Version(num(&value)?)),
        "create" | "c" => (T::Create, U::CreateRevision(num(&value)?)),
        "mod" | "m" => (T::Mod, U::ModRevision(num(&value)?)),
        "lease" => (T::Lease, U::Lease(parse_lease(&value)?)),
        other => bail!("unknown compare target {other:?}"),
    };
    Ok(pb::Compare {
        result: result as i32,
        target: t as i32,
        key: key.into_bytes(),
        range_end: vec![],
        target_union: Some(u),
    })
}

fn parse_op(s: &str) -> Result<pb::RequestOp> {
    use pb::request_op::Request as Q;
    let words: Vec<&str> = s.split_whitespace().collect();
    let request = match words.as_slice() {
        ["put", key, value @ ..] if !value.is_empty() => Q::RequestPut(pb::PutRequest {
            key: key.as_bytes().to_vec(),
            value: value.join(" ").into_bytes(),
            ..Default::default()
        }),
        ["get", key] => Q::RequestRange(pb::RangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }),
        ["del", key] => Q::RequestDeleteRange(pb::DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            ..Default::default()
        }),
        _ => bail!("bad operation {s:?}: use `put KEY VALUE`, `get KEY` or `del KEY`"),
    };
    Ok(pb::RequestOp {
        request: Some(request),
    })
}

pub async fn lease(ch: Channel, cmd: LeaseCommand) -> Result<()> {
    let mut lease = pb::lease_client::LeaseClient::new(ch);
    match cmd {
        LeaseCommand::Grant { ttl } => {
            let r = lease
                .lease_grant(pb::LeaseGrantRequest { ttl, id: 0 })
                .await
                .map_err(status_err)?
                .into_inner();
            println!("lease {:016x} granted with TTL({}s)", r.id, r.ttl);
        }
        LeaseCommand::Revoke { id } => {
            let id = parse_lease(&id)?;
            lease
                .lease_revoke(pb::LeaseRevokeRequest { id })
                .await
                .map_err(status_err)?;
            println!("lease {id:016x} revoked");
        }
        LeaseCommand::KeepAlive { id, once } => {
            let id = parse_lease(&id)?;
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            let mut stream = lease
                .lease_keep_alive(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map_err(status_err)?
                .into_inner();
            loop {
                tx.send(pb::LeaseKeepAliveRequest { id }).await?;
                let Some(resp) = stream.next().await else {
                    bail!("keep-alive stream closed by the server")
                };
                let resp = resp.map_err(status_err)?;
                if resp.ttl <= 0 {
                    bail!("lease {id:016x} expired or revoked");
                }
                println!("lease {id:016x} keepalived with TTL({})", resp.ttl);
                if once {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_secs((resp.ttl as u64 / 3).max(1))).await;
            }
        }
        LeaseCommand::Ttl { id, keys } => {
            let id = parse_lease(&id)?;
            let r = lease
                .lease_time_to_live(pb::LeaseTimeToLiveRequest { id, keys })
                .await
                .map_err(status_err)?
                .into_inner();
            if r.ttl < 0 {
                println!("lease {id:016x} already expired");
            } else {
                let attached: Vec<String> = r
                    .keys
                    .iter()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .collect();
                let suffix = if keys {
                    format!(", attached keys([{}])", attached.join(" "))
                } else {
                    String::new()
                };
                println!(
                    "lease {id:016x} granted with TTL({}s), remaining({}s){suffix}",
                    r.granted_ttl, r.ttl
                );
            }
        }
        LeaseCommand::List => {
            let r = lease
                .lease_leases(pb::LeaseLeasesRequest {})
                .await
                .map_err(status_err)?
                .into_inner();
            println!("found {} leases", r.leases.len());
            for l in r.leases {
                println!("{:016x}", l.id);
            }
        }
    }
    Ok(())
}
