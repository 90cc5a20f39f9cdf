//! Reads: get, list (selectors, pages and continue tokens) and the rendering of one object as
//! JSON, metadata or a table.

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::query::{FieldSelector, LabelSelector, Query};
use crate::storage::{decode, Freshness, Stored};
use crate::table::{self, Form};

use super::{json_response, meta_str, Api, Resp, Target};

pub(super) fn freshness(q: &Query) -> Result<Freshness, ApiError> {
    let rv = match q.get("resourceVersion") {
        None | Some("") => return Ok(Freshness::Latest),
        Some("0") => return Ok(Freshness::Any),
        Some(v) => v.parse::<i64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {v:?}: must be an integer"
            ))
        })?,
    };
    match q.get("resourceVersionMatch") {
        None | Some("") | Some("NotOlderThan") => Ok(Freshness::NotOlderThan(rv)),
        Some("Exact") => Ok(Freshness::Exact(rv)),
        Some(other) => Err(ApiError::bad_request(format!(
            "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\""
        ))),
    }
}

/// The continue token: where the next page starts and the revision every page is read at.
fn encode_continue(rv: i64, start_after: &str) -> String {
    use base64::Engine;
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{start_after}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

pub(super) fn decode_continue(token: &str) -> Result<(i64, String), ApiError> {
    use base64::Engine;
    let bad = || ApiError::bad_request("continue key is not valid: the token is malformed");
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(token))
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad());
    }
    let rv = v["rv"].as_i64().filter(|r| *r > 0).ok_or_else(bad)?;
    let start = v["start"].as_str().ok_or_else(bad)?;
    if start.contains("..") || start.starts_with('/') {
        return Err(bad());
    }
    Ok((rv, start.to_string()))
}

/// One page of a collection: its objects and the list's metadata (resourceVersion, continue).
pub(crate) struct Listed {
    pub(crate) items: Vec<Value>,
    pub(crate) meta: Value,
}

/// A page as a request's Accept header asks: a table, metadata only, or the list itself.
pub(super) fn render_list(t: &Target, listed: Listed, accept: &str, q: &Query) -> Resp {
    match table::form(accept) {
        Form::Table => json_response(
            200,
            &table::table(
                t.res,
                &listed.items,
                listed.meta,
                q.get("includeObject").unwrap_or("Metadata"),
            ),
        ),
        Form::Metadata => json_response(
            200,
            &json!({
                "kind": "PartialObjectMetadataList",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": listed.meta,
                "items": listed.items.iter().map(table::metadata_only).collect::<Vec<_>>(),
            }),
        ),
        Form::Object => json_response(200, &list_object(t, listed)),
    }
}

/// A page as the list object of its kind (`PodList`). Its items carry no `kind` or `apiVersion`:
/// kube-apiserver writes a typed list's items without their type meta, which the list names once.
pub(super) fn list_object(t: &Target, listed: Listed) -> Value {
    let mut items = listed.items;
    items.iter_mut().for_each(crate::value::strip_type_meta);
    json!({
        "kind": format!("{}List", t.res.kind),
        "apiVersion": t.res.api_version(),
        "metadata": listed.meta,
        "items": items,
    })
}

impl Api {
    pub(super) fn render_one(&self, t: &Target, object: Value, accept: &str, q: &Query) -> Resp {
        match table::form(accept) {
            Form::Object => json_response(200, &object),
            Form::Metadata => json_response(200, &table::metadata_only(&object)),
            Form::Table => {
                let rv = meta_str(&object, "resourceVersion")
                    .unwrap_or("")
                    .to_string();
                json_response(
                    200,
                    &table::table(
                        t.res,
                        &[object],
                        json!({"resourceVersion": rv}),
                        q.get("includeObject").unwrap_or("Metadata"),
                    ),
                )
            }
        }
    }

    pub(super) async fn get(&self, t: &Target, q: &Query) -> Result<Stored, ApiError> {
        self.store
            .get(&t.key(), freshness(q)?)
            .await?
            .ok_or_else(|| ApiError::not_found(t.res.group, t.res.plural, t.name()))
    }

    /// The objects of a collection matching the selectors: one page of at most `limit` (0: all)
    /// from `start` (a key suffix), read at `freshness`. Returns the objects, the revision and
    /// the key suffix to continue after, if more remain.
    pub(super) async fn select(
        &self,
        t: &Target,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: i64,
        start: Option<String>,
        mut freshness: Freshness,
    ) -> Result<(Vec<Value>, i64, Option<String>), ApiError> {
        let prefix = t.res.prefix(t.ns.as_deref());
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let mut from = match start {
            Some(s) => format!("{prefix}{s}"),
            None => prefix.clone(),
        };
        let mut items = Vec::new();
        let chunk = if limit > 0 { limit.max(100) } else { 0 };
        loop {
            let (kvs, rev, more) = self.store.range(&from, &end, chunk, freshness).await?;
            // Every further chunk reads at the same revision, so pages are one snapshot.
            freshness = Freshness::Exact(rev);
            let last_key = kvs.last().map(|kv| kv.key.to_vec());
            for kv in &kvs {
                let s = decode(kv)?;
                if labels.matches_object(&s.object) && fields.matches_object(&s.object) {
                    items.push(s.object);
                    if limit > 0 && items.len() as i64 == limit {
                        let key = String::from_utf8_lossy(&kv.key).to_string();
                        let suffix = key.strip_prefix(&prefix).unwrap_or(&key).to_string();
                        let remaining =
                            more || kv.key != *kvs.last().map(|k| &k.key).unwrap_or(&kv.key);
                        return Ok((items, rev, remaining.then_some(suffix)));
                    }
                }
            }
            match (more, last_key) {
                (true, Some(k)) => {
                    let mut next = k;
                    next.push(0);
                    from = String::from_utf8_lossy(&next).to_string();
                }
                _ => return Ok((items, rev, None)),
            }
        }
    }

    /// One page of a collection: the objects matching the query's selectors, from its
    /// continue token, at most its limit.
    pub(super) async fn list(&self, t: &Target, q: &Query) -> Result<Listed, ApiError> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.res.kind)?;
        let limit = q.int("limit")?.unwrap_or(0).max(0);
        let (fresh, start) = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(token) => {
                let (rv, start) = decode_continue(token)?;
                if rv <= self.store.compact_revision() {
                    return Err(ApiError::gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list."));
                }
                (Freshness::Exact(rv), Some(start))
            }
            None => (freshness(q)?, None),
        };
        let (items, rev, next) = self
            .select(t, &labels, &fields, limit, start, fresh)
            .await?;
        let mut meta = json!({"resourceVersion": rev.to_string()});
        if let Some(after) = next {
            meta["continue"] = json!(encode_continue(rev, after.trim_end_matches('\u{0}')));
        }
        Ok(Listed { items, meta })
    }
}
