//! Delete and deletecollection: delete options, finalizers, and the kind's strategy for how a
//! deletion ends (a grace period, a controller that finishes it).

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::query::{FieldSelector, LabelSelector, Query};
use crate::storage::{Fence, Freshness, Write};

use super::{meta_mut, meta_str, now, Api, Target, UPDATE_RETRIES};

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
        let strategy = t.res.strategy;
        strategy.check_delete(t.name())?;
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
                if strategy.propagation_finalizers() && !finalizers.iter().any(|x| x == f) {
                    finalizers.push(json!(f));
                }
            }
            // A kind that ends gracefully (a pod on a node) is marked with a deadline; whoever
            // stops it then deletes it for good (with a zero grace period).
            let grace = strategy.grace_period(&current.object, opts.grace);
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
                    crate::order::normalise(&mut new);
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
            if !finalizers.is_empty() || strategy.finished_by_controller() {
                // Marked, not removed: whoever owns the finalizers finishes the deletion.
                if strategy.deletion_marked(&current.object) {
                    return Ok(current.object);
                }
                let mut new = current.object.clone();
                let m = meta_mut(&mut new)?;
                if !finalizers.is_empty() {
                    m.insert("finalizers".into(), json!(finalizers));
                }
                m.insert("deletionTimestamp".into(), json!(now()));
                // For kinds that end gracefully this is the zero grace period's mark.
                m.insert("deletionGracePeriodSeconds".into(), json!(0));
                strategy.mark_for_deletion(&mut new);
                if dry_run {
                    crate::order::normalise(&mut new);
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
            if t.res.strategy.check_delete(one.name()).is_err() {
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
