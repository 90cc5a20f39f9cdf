//! Create: the server-owned fields of a new object, namespace lifecycle, then the kind's
//! strategy (its admission, and what it holds besides its key).

use serde_json::{json, Value};

use crate::admission;
use crate::error::ApiError;
use crate::query::Query;
use crate::resources;
use crate::storage::{decode, set_resource_version, Fence, Freshness};

use super::{meta_mut, meta_str, new_uid, now, random_suffix, Api, Target, UPDATE_RETRIES};

impl Api {
    /// Fills in what the server owns on a new object and checks what the client sent.
    fn prepare_create(&self, t: &Target, object: &mut Value) -> Result<(), ApiError> {
        let res = t.res;
        let api_version = res.api_version();
        if let Some(av) = object.get("apiVersion").and_then(Value::as_str) {
            if av != api_version {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({av}) does not match the expected API version ({api_version})"
                )));
            }
        }
        if let Some(kind) = object.get("kind").and_then(Value::as_str) {
            if kind != res.kind {
                return Err(ApiError::bad_request(format!(
                    "the kind in the data ({kind}) does not match the expected kind ({})",
                    res.kind
                )));
            }
        }
        let o = object
            .as_object_mut()
            .ok_or_else(|| ApiError::bad_request("the request body is not a JSON object"))?;
        o.insert("apiVersion".into(), json!(api_version));
        o.insert("kind".into(), json!(res.kind));
        let m = meta_mut(object)?;
        if res.namespaced {
            let url_ns = t.ns.clone().unwrap_or_default();
            match m.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() && ns != url_ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ))
                }
                _ => {
                    m.insert("namespace".into(), json!(url_ns));
                }
            }
        } else {
            m.shift_remove("namespace");
        }
        let name = m
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if name.is_empty() {
            if let Some(prefix) = m
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|p| !p.is_empty())
            {
                let n = format!("{}{}", &prefix[..prefix.len().min(58)], random_suffix());
                m.insert("name".into(), json!(n));
            }
        }
        m.insert("uid".into(), json!(new_uid()));
        m.insert("creationTimestamp".into(), json!(now()));
        for f in [
            "resourceVersion",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
        ] {
            m.shift_remove(f);
        }
        if res.has_spec {
            m.insert("generation".into(), json!(1));
        } else {
            m.shift_remove("generation");
        }
        Ok(())
    }

    /// NamespaceLifecycle: new objects only go into namespaces that exist and are not
    /// terminating.
    async fn check_namespace(&self, t: &Target) -> Result<(), ApiError> {
        let Some(ns) = t.ns.as_deref().filter(|_| t.res.namespaced) else {
            return Ok(());
        };
        let nsres = resources::find("", "v1", "namespaces").expect("namespaces are served");
        let key = nsres.key(None, ns);
        // The local state first; a namespace created a moment ago elsewhere needs a fresh read.
        let found = match self.store.get(&key, Freshness::Any).await? {
            Some(s) => Some(s),
            None => self.store.get(&key, Freshness::Latest).await?,
        };
        match found {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(s) if s.object.pointer("/metadata/deletionTimestamp").is_some()
                || s.object.pointer("/status/phase") == Some(&json!("Terminating")) =>
            {
                Err(ApiError::forbidden(format!(
                    "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    t.res.qualified(),
                    meta_str(&Value::Null, "name").unwrap_or("")
                )))
            }
            Some(_) => Ok(()),
        }
    }

    /// Creates an object as a POST would (also for the server's own bootstrap objects).
    pub(crate) async fn create_object(
        &self,
        t: &Target,
        q: &Query,
        object: Value,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        self.create(t, q, object, fence).await
    }

    /// Creates an object: the server's fields, admission, validation, then a write that
    /// claims its key (and what the kind holds besides, the namespace's quota). Returns the object
    /// as stored.
    pub(super) async fn create(
        &self,
        t: &Target,
        q: &Query,
        mut object: Value,
        fence: Fence,
    ) -> Result<Value, ApiError> {
        let dry_run = q.dry_run()?;
        if t.res.is_virtual() {
            return Err(ApiError::method_not_allowed(format!(
                "{} are answered, not stored",
                t.res.qualified()
            )));
        }
        self.prepare_create(t, &mut object)?;
        admission::defaults(t.res, &mut object);
        t.res.strategy.drop_disabled_fields(None, &mut object);
        self.check_namespace(t).await?;
        let strategy = t.res.strategy;
        strategy.admit_create(self, t, &mut object).await?;
        let generated = meta_str(&object, "generateName").is_some() && t.name.is_none();
        for _ in 0..UPDATE_RETRIES {
            admission::validate(t.res, &object)?;
            let name = meta_str(&object, "name").unwrap_or("").to_string();
            let key = t.res.key(t.ns.as_deref(), &name);
            let mut obj = object.clone();
            strategy.allocate(&self.net, &mut obj)?;
            strategy.prepare_for_store(self, t, &mut obj).await?;
            // The answer is in Kubernetes' field order, as stored, whatever order the body had.
            crate::order::normalise(&mut obj);
            let changes = self.changes_for(t, &key, 0, None, Some(&obj)).await?;
            if dry_run {
                return Ok(obj);
            }
            if let Some(rev) = self.store.apply(&changes, fence).await? {
                set_resource_version(&mut obj, rev);
                return Ok(obj);
            }
            if self.store.get(&key, Freshness::Latest).await?.is_some() {
                if generated {
                    // A generated name collided: draw another.
                    let prefix = meta_str(&object, "generateName").unwrap_or("").to_string();
                    meta_mut(&mut object)?
                        .insert("name".into(), json!(format!("{prefix}{}", random_suffix())));
                    continue;
                }
                return Err(ApiError::already_exists(t.res.group, t.res.plural, &name));
            }
            strategy.check_claims(self, &object, None).await?;
            // A quota moved or a picked address was taken meanwhile: go again.
        }
        Err(ApiError::new(
            500,
            "ServerTimeout",
            "the object could not be stored after several attempts (concurrent changes); try again",
        ))
    }

    /// Every object of a resource in one namespace, as this member has them.
    pub(crate) async fn namespace_objects(
        &self,
        plural: &str,
        ns: &str,
    ) -> Result<Vec<Value>, ApiError> {
        let res = resources::find("", "v1", plural).expect("a served core resource");
        let prefix = res.prefix(Some(ns));
        let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
        let (kvs, _, _) = self.store.range(&prefix, &end, 0, Freshness::Any).await?;
        kvs.iter().map(|kv| decode(kv).map(|s| s.object)).collect()
    }
}
