//! Delete and deletecollection: delete options, finalizers and a pod's graceful termination.

use serde_json::{json, Value};

use crate::admission;
use crate::error::ApiError;
use crate::query::{FieldSelector, LabelSelector, Query};
use crate::storage::{Fence, Freshness, Write};

use super::{meta_mut, meta_str, now, Api, Target, UPDATE_RETRIES};

/// How long a pod being deleted may take to stop, in seconds: 0 (deleted at once) for a pod
/// no node runs (unscheduled, or finished), else the request's grace period or the pod's
/// `terminationGracePeriodSeconds` (30 by default).
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let bound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty());
    let phase = pod.pointer("/status/phase").and_then(Value::as_str);
    if !bound || matches!(phase, Some("Succeeded" | "Failed")) {
        return 0;
    }
    match requested {
        Some(g) if g >= 0 => g,
        _ => pod
            .pointer("/spec/terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .filter(|g| *g >= 0)
            .unwrap_or(30),
    }
}

/// Delete options from the body (DeleteOptions) or the query.
struct DeleteOptions {
    grace: Option<i64>,
    propagation: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
}

impl DeleteOptions {
    fn from(q: &Query, body: Option<&Value>) -> Result<DeleteOptions, ApiError> {
        let b = body.cloned().unwrap_or(json!({}));
        let grace = match b.get("gracePeriodSeconds").and_then(Value::as_i64) {
            Some(g) => Some(g),
            None => q.int("gracePeriodSeconds")?,
        };
        let propagation = b
            .get("propagationPolicy")
            .and_then(Value::as_str)
            .or(q.get("propagationPolicy"))
            .map(str::to_string);
        if let Some(p) = &propagation {
            if !["Orphan", "Background", "Foreground"].contains(&p.as_str()) {
                return Err(ApiError::bad_request(format!(
                    "propagationPolicy: Unsupported value: {p:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                )));
            }
        }
        Ok(DeleteOptions {
            grace,
            propagation,
            uid: b
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            resource_version: b
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

impl Api {
    pub(crate) async fn delete_object(
        &self,
        t: &Target,
        q: &Query,
        body: Option<&Value>,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        self.delete(t, q, body, fence).await
    }

    /// Deletes one object, or marks it for deletion when finalizers hold it. Returns what the
    /// response carries: the object's last state.
    pub(super) async fn delete(
        &self,
        t: &Target,
        q: &Query,
        body: Option<&Value>,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let dry_run = q.dry_run()?;
        let opts = DeleteOptions::from(q, body)?;
        if t.res.kind == "Namespace" && admission::protected_namespace(t.name()) {
            return Err(ApiError::forbidden(format!(
                "namespaces \"{}\" is forbidden: this namespace may not be deleted",
                t.name()
            )));
        }
        for _ in 0..UPDATE_RETRIES {
            let current = self.get(t, &Query::default()).await?;
            if let Some(uid) = &opts.uid {
                let have = meta_str(&current.object, "uid").unwrap_or("");
                if uid != have {
                    return Err(ApiError::conflict(t.res.group, t.res.plural, t.name(), &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                    )));
                }
            }
            if let Some(rv) = &opts.resource_version {
                if *rv != current.revision.to_string() {
                    return Err(ApiError::conflict(t.res.group, t.res.plural, t.name(), &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                        current.revision
                    )));
                }
            }
            let mut finalizers: Vec<Value> = current
                .object
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            // Orphan and Foreground propagation are finalizers the garbage collector finishes:
            // it releases or deletes the dependents, then removes them.
            let propagation_finalizer = match opts.propagation.as_deref() {
                Some("Orphan") => Some("orphan"),
                Some("Foreground") => Some("foregroundDeletion"),
                _ => None,
            };
            if let Some(f) = propagation_finalizer {
                if t.res.kind != "Namespace" && !finalizers.iter().any(|x| x == f) {
                    finalizers.push(json!(f));
                }
            }
            let is_namespace = t.res.kind == "Namespace";
            // A pod on a node ends gracefully: marked with a deadline, its agent stops the
            // containers and then deletes it for good (with a zero grace period).
            let grace = if t.res.group.is_empty() && t.res.kind == "Pod" {
                pod_grace_period(&current.object, opts.grace)
            } else {
                0
            };
            if grace > 0 {
                let mut new = current.object.clone();
                let deadline = chrono::Utc::now() + chrono::Duration::seconds(grace);
                let stamp = deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
                let marked = current
                    .object
                    .pointer("/metadata/deletionTimestamp")
                    .and_then(Value::as_str)
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
                match marked {
                    // Already terminating with an earlier or the same deadline.
                    Some(at) if at.with_timezone(&chrono::Utc) <= deadline => {
                        return Ok(current.object)
                    }
                    _ => {}
                }
                let m = meta_mut(&mut new)?;
                if !finalizers.is_empty() {
                    m.insert("finalizers".into(), json!(finalizers));
                }
                m.insert("deletionTimestamp".into(), json!(stamp));
                m.insert("deletionGracePeriodSeconds".into(), json!(grace));
                if dry_run {
                    return Ok(new);
                }
                match self
                    .store
                    .put_if(&t.key(), &new, current.revision, fence)
                    .await?
                {
                    Write::Done(s) => return Ok(s.object),
                    Write::Lost(_) => continue,
                }
            }
            if !finalizers.is_empty() || is_namespace {
                // Marked, not removed: whoever owns the finalizers finishes the deletion.
                if current
                    .object
                    .pointer("/metadata/deletionTimestamp")
                    .is_some()
                    && (t.res.kind != "Pod"
                        || current
                            .object
                            .pointer("/metadata/deletionGracePeriodSeconds")
                            == Some(&json!(0)))
                {
                    return Ok(current.object);
                }
                let mut new = current.object.clone();
                let m = meta_mut(&mut new)?;
                if !finalizers.is_empty() {
                    m.insert("finalizers".into(), json!(finalizers));
                }
                m.insert("deletionTimestamp".into(), json!(now()));
                // Only pods end gracefully; for them this is the zero grace period's mark.
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                if is_namespace {
                    crate::value::set(&mut new, &["status", "phase"], json!("Terminating"));
                }
                if dry_run {
                    return Ok(new);
                }
                match self
                    .store
                    .put_if(&t.key(), &new, current.revision, fence)
                    .await?
                {
                    Write::Done(s) => return Ok(s.object),
                    Write::Lost(_) => continue,
                }
            }
            if dry_run {
                return Ok(current.object);
            }
            let changes = self
                .changes_for(t, &t.key(), current.revision, Some(&current.object), None)
                .await?;
            if self.store.apply(&changes, fence).await?.is_some() {
                return Ok(current.object);
            }
        }
        Err(ApiError::conflict(
            t.res.group,
            t.res.plural,
            t.name(),
            "too many concurrent updates; try again",
        ))
    }

    /// Deletes every object of a collection the query's selectors match; returns the list of
    /// what was deleted.
    pub(super) async fn delete_collection(
        &self,
        t: &Target,
        q: &Query,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
            .map_err(ApiError::bad_request)?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or(""), t.res.kind)?;
        let (items, rev, _) = self
            .select(t, &labels, &fields, 0, None, Freshness::Latest)
            .await?;
        let mut deleted = Vec::new();
        for item in items {
            let name = meta_str(&item, "name").unwrap_or("").to_string();
            let ns = meta_str(&item, "namespace").map(str::to_string);
            let one = Target {
                res: t.res,
                ns: ns.or(t.ns.clone()),
                name: Some(name),
                sub: None,
            };
            if t.res.kind == "Namespace" && admission::protected_namespace(one.name()) {
                continue;
            }
            match self.delete(&one, q, None, fence).await {
                Ok(o) => deleted.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json!({
            "kind": format!("{}List", t.res.kind),
            "apiVersion": t.res.api_version(),
            "metadata": {"resourceVersion": rev.to_string()},
            "items": deleted,
        }))
    }
}
