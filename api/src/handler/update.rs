//! Update, patch and server-side apply, and the store changes every write makes (the object,
//! the claims its strategy names and quota usage).

use serde_json::{json, Value};

use crate::admission;
use crate::error::ApiError;
use crate::fieldvalidation;
use crate::patch::{self, PatchType};
use crate::query::Query;
use crate::quota;
use crate::resources::{self, Resource};
use crate::storage::{decode, set_resource_version, Change, Fence, Freshness, Stored};

use super::{meta, meta_mut, meta_str, now, Api, Patch, Target, UPDATE_RETRIES};

/// What a patch answers: the object as stored (a Scale for /scale), whether an apply created
/// it, and the warnings of field validation.
pub(crate) struct Patched {
    pub(crate) object: Value,
    pub(crate) created: bool,
    pub(crate) warnings: Vec<String>,
}

impl Api {
    /// Every store change that goes with writing `new` (None: deleting) over `old` at `key`:
    /// the object, the keys its kind claims besides (a Service's addresses) and the usage of the
    /// namespace's quotas.
    pub(super) async fn changes_for(
        &self,
        t: &Target,
        key: &str,
        expected: i64,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> Result<Vec<Change>, ApiError> {
        let mut changes = vec![Change {
            key: key.to_string(),
            expected: Some(expected),
            write: new.cloned(),
        }];
        let any = new.or(old);
        let name = any
            .and_then(|o| meta_str(o, "name"))
            .unwrap_or("")
            .to_string();
        let before = old.map(|o| t.res.strategy.claims(o)).unwrap_or_default();
        let after = new.map(|o| t.res.strategy.claims(o)).unwrap_or_default();
        if !before.is_empty() || !after.is_empty() {
            let owner = json!({"service": format!("{}/{name}", t.ns.as_deref().unwrap_or(""))});
            for c in after.iter().filter(|c| !before.contains(c)) {
                changes.push(Change {
                    key: c.clone(),
                    expected: Some(0),
                    write: Some(owner.clone()),
                });
            }
            for c in before.iter().filter(|c| !after.contains(c)) {
                changes.push(Change {
                    key: c.clone(),
                    expected: None,
                    write: None,
                });
            }
        }
        if t.res.namespaced && t.res.strategy.charged_by_quota() {
            let delta = quota::delta(t.res, old, new);
            if !delta.is_empty() {
                let qres = resources::find("", "v1", "resourcequotas").expect("served");
                let ns =
                    t.ns.as_deref()
                        .or_else(|| any.and_then(|o| meta_str(o, "namespace")))
                        .unwrap_or("");
                let prefix = qres.prefix(Some(ns));
                let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
                let (kvs, _, _) = self
                    .store
                    .range(&prefix, &end, 0, Freshness::Latest)
                    .await?;
                for kv in kvs {
                    let q = decode(&kv)?;
                    if let Some(charged) = quota::charge(&q.object, t.res, &name, new, &delta)? {
                        changes.push(Change {
                            key: String::from_utf8_lossy(&kv.key).to_string(),
                            expected: Some(q.revision),
                            write: Some(charged),
                        });
                    }
                }
            }
        }
        Ok(changes)
    }

    /// A quota's status computed from the objects in its namespace, and the revision read at.
    pub(crate) async fn quota_status(
        &self,
        ns: &str,
        hard: &serde_json::Map<String, Value>,
        freshness: Freshness,
    ) -> Result<(Value, i64), ApiError> {
        let mut totals = std::collections::BTreeMap::new();
        let mut fresh = freshness;
        let mut revision = 0;
        let mut seen = std::collections::HashSet::new();
        for res in resources::RESOURCES
            .iter()
            .filter(|r| r.namespaced && !r.storage.is_empty())
        {
            if !seen.insert(res.storage) {
                continue;
            }
            let prefix = res.prefix(Some(ns));
            let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
            let (kvs, rev, _) = self.store.range(&prefix, &end, 0, fresh).await?;
            // Every resource is read at the same revision.
            fresh = Freshness::Exact(rev);
            revision = rev;
            for kv in kvs {
                let o = decode(&kv)?;
                for (k, v) in quota::usage(res, &o.object) {
                    *totals.entry(k).or_insert(0) += v;
                }
            }
        }
        Ok((quota::status_from(hard, &totals), revision))
    }

    /// The new state of an object from a full replacement (`PUT`), given its current state.
    fn merge_update(
        &self,
        t: &Target,
        current: &Value,
        mut new: Value,
        sub: Option<&str>,
    ) -> Result<Value, ApiError> {
        let res = t.res;
        if let Some(kind) = new.get("kind").and_then(Value::as_str) {
            let want = if sub == Some("scale") {
                "Scale"
            } else {
                res.kind
            };
            if kind != want {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({kind}) does not match the expected kind ({want})"
                )));
            }
        }
        match sub {
            Some("status") => {
                let mut out = current.clone();
                crate::value::set(
                    &mut out,
                    &["status"],
                    new.get("status").cloned().unwrap_or(json!({})),
                );
                return Ok(out);
            }
            Some("scale") => {
                let replicas = new
                    .pointer("/spec/replicas")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if replicas < 0 {
                    return Err(ApiError::invalid(
                        "autoscaling",
                        "Scale",
                        t.name(),
                        vec![crate::error::Cause {
                            reason: "FieldValueInvalid",
                            field: "spec.replicas".into(),
                            message: format!(
                                "Invalid value: {replicas}: must be greater than or equal to 0"
                            ),
                        }],
                    ));
                }
                let mut out = current.clone();
                crate::value::set(&mut out, &["spec", "replicas"], json!(replicas));
                return Ok(bump_generation(res, current, out));
            }
            Some("finalize") => {
                let mut out = current.clone();
                let finalizers = new
                    .pointer("/spec/finalizers")
                    .cloned()
                    .unwrap_or(json!([]));
                crate::value::set(&mut out, &["spec", "finalizers"], finalizers);
                return Ok(out);
            }
            Some("approval") => {
                let mut out = current.clone();
                let conditions = new
                    .pointer("/status/conditions")
                    .cloned()
                    .unwrap_or(json!([]));
                crate::value::set(&mut out, &["status", "conditions"], conditions);
                return Ok(out);
            }
            _ => {}
        }
        let o = new
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
        o.insert("apiVersion".into(), json!(res.api_version()));
        o.insert("kind".into(), json!(res.kind));
        if res.subresources.contains(&"status") {
            match current.get("status") {
                Some(s) => {
                    o.insert("status".into(), s.clone());
                }
                None => {
                    o.shift_remove("status");
                }
            }
        }
        let cur_meta = meta(current).cloned().unwrap_or_default();
        let m = meta_mut(&mut new)?;
        if let Some(n) = m.get("name").and_then(Value::as_str) {
            if n != t.name() {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
        }
        m.insert("name".into(), json!(t.name()));
        if res.namespaced {
            m.insert("namespace".into(), json!(t.ns.clone().unwrap_or_default()));
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "generateName",
        ] {
            match cur_meta.get(f) {
                Some(v) => {
                    m.insert(f.into(), v.clone());
                }
                None => {
                    m.shift_remove(f);
                }
            }
        }
        res.strategy.prepare_for_update(current, &mut new);
        admission::defaults(res, &mut new);
        res.strategy.drop_disabled_fields(Some(current), &mut new);
        Ok(bump_generation(res, current, new))
    }

    /// Stores the new state of an object whose current state was read at `current.revision`.
    /// An object being deleted whose last finalizer is gone is deleted instead.
    pub(super) async fn commit(
        &self,
        t: &Target,
        current: &Stored,
        new: Value,
        dry_run: bool,
        fence: Fence,
    ) -> Result<Option<Stored>, ApiError> {
        admission::validate(t.res, &new)?;
        check_immutable(t.res, &current.object, &new)?;
        t.res
            .strategy
            .admit_update(self, t, &current.object, &new)
            .await?;
        let finalizers_done = new.pointer("/metadata/deletionTimestamp").is_some()
            && new
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(|f| f.is_empty());
        let mut new = new;
        if !finalizers_done {
            t.res.strategy.allocate(&self.net, &mut new)?;
        }
        // The answer is in Kubernetes' field order, as stored, whatever order the body had.
        crate::order::normalise(&mut new);
        let write = (!finalizers_done).then(|| new.clone());
        let changes = self
            .changes_for(
                t,
                &t.key(),
                current.revision,
                Some(&current.object),
                write.as_ref(),
            )
            .await?;
        if dry_run {
            return Ok(Some(Stored {
                object: new,
                revision: current.revision,
            }));
        }
        match self.store.apply(&changes, fence).await? {
            Some(revision) => {
                let mut object = write.unwrap_or_else(|| current.object.clone());
                set_resource_version(&mut object, revision);
                Ok(Some(Stored { object, revision }))
            }
            None => {
                t.res
                    .strategy
                    .check_claims(self, &new, Some(&current.object))
                    .await?;
                Ok(None)
            }
        }
    }

    /// Replaces an object (or sets its subresource) from a full body, retrying when it moved
    /// meanwhile unless the body pins a resourceVersion. Returns what a request answers: the
    /// object as stored, or its Scale.
    pub(super) async fn update(
        &self,
        t: &Target,
        q: &Query,
        body: Value,
        sub: Option<&str>,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let dry_run = q.dry_run()?;
        let pinned = body
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i64>().map_err(|_| {
                    ApiError::bad_request(format!("metadata.resourceVersion: Invalid value: {s:?}"))
                })
            })
            .transpose()?;
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            if let Some(rv) = pinned {
                if rv != current.revision {
                    return Err(ApiError::stale(t.res.group, t.res.plural, t.name()));
                }
            }
            let new = self.merge_update(t, &current.object, body.clone(), sub)?;
            if let Some(s) = self.commit(t, &current, new, dry_run, fence).await? {
                return Ok(if sub == Some("scale") {
                    scale_of(t.res, &s.object)
                } else {
                    s.object
                });
            }
            if pinned.is_some() {
                return Err(ApiError::stale(t.res.group, t.res.plural, t.name()));
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    /// Patches an object (JSON patch, merge patch, strategic merge patch, or server-side
    /// apply), retrying on the newest state when it moved meanwhile.
    pub(super) async fn patch(
        &self,
        t: &Target,
        q: &Query,
        patch: Patch<'_>,
        sub: Option<&str>,
        fence: Fence,
    ) -> Result<Patched, ApiError> {
        let dry_run = q.dry_run()?;
        if patch.kind == PatchType::Apply {
            return self.server_side_apply(t, q, &patch.body, sub, fence).await;
        }
        let (kind, raw, patch) = (patch.kind, patch.raw, patch.body);
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            // A patch applies to what the client sees: the Scale for /scale.
            let mut view = if sub == Some("scale") {
                scale_of(t.res, &current.object)
            } else {
                current.object.clone()
            };
            let before = view.clone();
            match kind {
                PatchType::Json => patch::json_patch(&mut view, &patch)?,
                PatchType::StrategicMerge => {
                    let (group, version, kind) = if sub == Some("scale") {
                        ("autoscaling", "v1", "Scale")
                    } else {
                        (t.res.group, t.res.version, t.res.kind)
                    };
                    let def = crate::openapi::schemas::schemas().kind_def(group, version, kind);
                    crate::strategic::apply(def, &mut view, &patch)?
                }
                _ => patch::merge_patch(&mut view, &patch),
            }
            let warnings = fieldvalidation::check_patch(t.res, sub, raw, &before, &view, q)?;
            let pinned = view
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<i64>().ok())
                .filter(|rv| {
                    patch.pointer("/metadata/resourceVersion").is_some() && *rv != current.revision
                });
            if pinned.is_some() {
                return Err(ApiError::stale(t.res.group, t.res.plural, t.name()));
            }
            let new = match sub {
                None => {
                    let mut new = self.merge_update(t, &current.object, view.clone(), None)?;
                    // A patch of the main resource leaves status as it was (merge_update did),
                    // except for kinds without a status subresource, where it is part of the object.
                    if !t.res.subresources.contains(&"status") {
                        if let Some(s) = view.get("status") {
                            crate::value::set(&mut new, &["status"], s.clone());
                        }
                    }
                    new
                }
                Some(s) => self.merge_update(t, &current.object, view, Some(s))?,
            };
            if let Some(s) = self.commit(t, &current, new, dry_run, fence).await? {
                let object = if sub == Some("scale") {
                    scale_of(t.res, &s.object)
                } else {
                    s.object
                };
                return Ok(Patched {
                    object,
                    created: false,
                    warnings,
                });
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    /// Server-side apply: creates the object if it is absent, else merges the configuration
    /// in, with field ownership (see [`crate::apply`]).
    async fn server_side_apply(
        &self,
        t: &Target,
        q: &Query,
        config: &Value,
        sub: Option<&str>,
        fence: Fence,
    ) -> Result<Patched, ApiError> {
        let dry_run = q.dry_run()?;
        let manager = q
            .get("fieldManager")
            .filter(|m| !m.is_empty())
            .ok_or_else(|| {
                ApiError::invalid(
                    "meta.k8s.io",
                    "PatchOptions",
                    "",
                    vec![crate::error::Cause {
                        reason: "FieldValueRequired",
                        field: "fieldManager".into(),
                        message: "Required value: is required for apply patch".into(),
                    }],
                )
            })?;
        if sub.is_some() {
            return Err(ApiError::method_not_allowed("server-side apply of a subresource is not supported by this server; apply the object itself"));
        }
        let force = q.flag("force");
        if !config.is_object() {
            return Err(ApiError::bad_request(
                "the applied configuration is not an object",
            ));
        }
        if let Some(n) = config.pointer("/metadata/name").and_then(Value::as_str) {
            if n != t.name() {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({})",
                    t.name()
                )));
            }
        }
        let def =
            crate::openapi::schemas::schemas().kind_def(t.res.group, t.res.version, t.res.kind);
        let api_version = t.res.api_version();
        for _ in 0..UPDATE_RETRIES {
            let current = self.store.get(&t.key(), Freshness::Latest).await?;
            let Some(current) = current else {
                let mut object =
                    crate::apply::apply(def, None, config, manager, force, &api_version, &now())?;
                crate::value::set(&mut object, &["metadata", "name"], json!(t.name()));
                return Ok(Patched {
                    object: self.create(t, q, object, fence).await?,
                    created: true,
                    warnings: Vec::new(),
                });
            };
            let applied = crate::apply::apply(
                def,
                Some(&current.object),
                config,
                manager,
                force,
                &api_version,
                &now(),
            )?;
            let new = self.merge_update(t, &current.object, applied, None)?;
            if let Some(s) = self.commit(t, &current, new, dry_run, fence).await? {
                return Ok(Patched {
                    object: s.object,
                    created: false,
                    warnings: Vec::new(),
                });
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }
}

/// A copy of `new` with metadata.generation bumped if its spec (the part its kind counts)
/// differs from `current`'s.
pub(super) fn bump_generation(res: &Resource, current: &Value, mut new: Value) -> Value {
    let changed = res.strategy.generation_source(current) != res.strategy.generation_source(&new);
    if res.has_spec && changed {
        let g = current
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            + 1;
        crate::value::set(&mut new, &["metadata", "generation"], json!(g));
    }
    new
}

/// Fields that may not change after creation (the kind's rules).
pub(super) fn check_immutable(
    res: &Resource,
    current: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    let mut causes = Vec::new();
    let name = meta_str(new, "name").unwrap_or("");
    res.strategy.validate_update(current, new, &mut causes);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(res.group, res.kind, name, causes))
    }
}

/// The autoscaling/v1 Scale of a workload.
pub(super) fn scale_of(res: &Resource, o: &Value) -> Value {
    let selector = match o.pointer("/spec/selector") {
        Some(sel) if sel.get("matchLabels").is_some() || sel.get("matchExpressions").is_some() => {
            let mut parts: Vec<String> = sel
                .get("matchLabels")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect();
            parts.sort();
            parts.join(",")
        }
        Some(sel) => sel
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
            .collect::<Vec<_>>()
            .join(","),
        None => String::new(),
    };
    let m = meta(o).cloned().unwrap_or_default();
    let _ = res;
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m.get("name"), "namespace": m.get("namespace"), "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"), "creationTimestamp": m.get("creationTimestamp"),
        },
        "spec": {"replicas": o.pointer("/spec/replicas").cloned().unwrap_or(json!(0))},
        "status": {
            "replicas": o.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector,
        },
    })
}
