//! Watch: the current state as ADDED events, then the store's changes filtered by the selectors,
//! streamed as JSON lines.

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use hyper::Response;
use rkube_store::mvcc::types::{EventKind, KeyRange};
use rkube_store::mvcc::watch::{self as store_watch, WatchMessage, WatchSpec};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::query::{FieldSelector, LabelSelector, Query};
use crate::storage::{decode, set_resource_version, Freshness};
use crate::table::{self, Form};

use super::{Api, Resp, Target};

impl Api {
    pub(super) async fn watch(
        &self,
        t: &Target,
        q: &Query,
        accept: &str,
    ) -> Result<Resp, ApiError> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.res.kind)?;
        let bookmarks = q.flag("allowWatchBookmarks");
        let timeout =
            Duration::from_secs(q.int("timeoutSeconds")?.filter(|s| *s > 0).unwrap_or(1800) as u64);
        let form = table::form(accept);
        let include = q.get("includeObject").unwrap_or("Metadata").to_string();
        let res = t.res;
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
        let encode = move |ty: &str, object: Value| -> Bytes {
            let object = match (form, ty) {
                (_, "ERROR" | "BOOKMARK") => object,
                (Form::Table, _) => {
                    table::table(res, std::slice::from_ref(&object), json!({}), &include)
                }
                (Form::Metadata, _) => table::metadata_only(&object),
                (Form::Object, _) => object,
            };
            let mut line =
                crate::encoding::to_vec(&json!({"type": ty, "object": object})).unwrap_or_default();
            line.push(b'\n');
            Bytes::from(line)
        };
        // Where to start: rv unset or 0 sends the current state as ADDED events first.
        let start = match q.get("resourceVersion") {
            None | Some("") | Some("0") => {
                let fresh = if q.get("resourceVersion") == Some("0") {
                    Freshness::Any
                } else {
                    Freshness::Latest
                };
                let (items, rev, _) = self.select(t, &labels, &fields, 0, None, fresh).await?;
                for item in items {
                    let _ = tx.send(Ok(encode("ADDED", item))).await;
                }
                rev + 1
            }
            Some(v) => {
                let rv: i64 = v.parse().map_err(|_| {
                    ApiError::bad_request(format!(
                        "resourceVersion: Invalid value: {v:?}: must be an integer"
                    ))
                })?;
                rv + 1
            }
        };
        let prefix = t.res.prefix(t.ns.as_deref());
        let spec = WatchSpec {
            range: match &t.name {
                Some(n) => KeyRange::single(t.res.key(t.ns.as_deref(), n).into_bytes()),
                None => KeyRange::prefix(prefix.into_bytes()),
            },
            start_revision: start,
            prev_kv: true,
            progress_every: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let kind = t.res.kind;
        let api_version = t.res.api_version();
        let compact = self.store.compact_revision();
        if start <= compact {
            let e = ApiError::gone(format!(
                "too old resource version: {} ({})",
                start - 1,
                compact + 1
            ));
            let _ = tx.send(Ok(encode("ERROR", e.status()))).await;
            drop(tx);
            return Ok(stream_response(rx));
        }
        let mut events = store_watch::start(self.node.mvcc.clone(), spec, 1024);
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            loop {
                let msg = tokio::select! {
                    m = events.recv() => m,
                    _ = tokio::time::sleep_until(deadline) => None,
                    _ = tx.closed() => None,
                };
                let Some(msg) = msg else { break };
                match msg {
                    WatchMessage::Events {
                        revision,
                        events: evs,
                    } => {
                        for ev in evs {
                            let old = ev
                                .prev_kv
                                .as_ref()
                                .and_then(|kv| decode(kv).ok())
                                .map(|s| s.object);
                            let matches =
                                |o: &Value| labels.matches_object(o) && fields.matches_object(o);
                            let old_matches = old.as_ref().is_some_and(matches);
                            let out = match ev.kind {
                                EventKind::Put => {
                                    let Ok(new) = decode(&ev.kv) else { continue };
                                    let new = new.object;
                                    match (old_matches, matches(&new)) {
                                        (true, true) => Some(("MODIFIED", new)),
                                        (false, true) => Some(("ADDED", new)),
                                        (true, false) => Some(("DELETED", new)),
                                        (false, false) => None,
                                    }
                                }
                                EventKind::Delete => old.filter(|_| old_matches).map(|mut o| {
                                    set_resource_version(&mut o, revision);
                                    ("DELETED", o)
                                }),
                            };
                            if let Some((ty, o)) = out {
                                if tx.send(Ok(encode(ty, o))).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                    WatchMessage::Progress { revision } => {
                        if bookmarks {
                            let b = json!({"kind": kind, "apiVersion": api_version,
                                           "metadata": {"resourceVersion": revision.to_string()}});
                            if tx.send(Ok(encode("BOOKMARK", b))).await.is_err() {
                                return;
                            }
                        }
                    }
                    WatchMessage::Compacted { compact_revision } => {
                        let e = ApiError::gone(format!(
                            "too old resource version: {} ({compact_revision})",
                            start - 1
                        ));
                        let _ = tx.send(Ok(encode("ERROR", e.status()))).await;
                        return;
                    }
                }
            }
        });
        Ok(stream_response(rx))
    }
}

fn stream_response(rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Resp {
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
