//! What is special about a kind, in one place per kind (Kubernetes' registry strategies,
//! `pkg/registry/<group>/<kind>/strategy.go`).
//!
//! The verbs in [`crate::handler`] are generic: they call the hooks of the resource's
//! [`Strategy`] (`Resource::strategy` in the table of [`crate::resources`]) and never ask which
//! kind they handle. Every hook has a default that is the generic behaviour, so a kind's file
//! holds only what differs: its defaults and validation, the server-set fields it keeps on
//! update, the addresses it claims, and how its deletion ends.

pub mod certificatesigningrequest;
pub mod configmap;
pub mod controllerrevision;
pub mod cronjob;
pub mod csidriver;
pub mod csinode;
pub mod csistoragecapacity;
pub mod daemonset;
pub mod deployment;
pub(crate) mod field;
pub mod horizontalpodautoscaler;
pub mod ingress;
pub mod ingressclass;
pub mod job;
pub mod namespace;
pub mod networkpolicy;
pub mod node;
pub mod persistentvolume;
pub mod persistentvolumeclaim;
pub mod pod;
pub mod poddisruptionbudget;
pub mod podtemplate;
pub mod priorityclass;
pub mod rbac;
pub mod replicaset;
pub mod replicationcontroller;
pub mod resourcequota;
pub mod runtimeclass;
pub mod secret;
pub mod service;
pub mod statefulset;
pub mod storageclass;
pub mod volumeattachment;

use std::future::Future;
use std::pin::Pin;

use serde_json::Value;

use crate::auth::User;
use crate::error::{ApiError, Cause};
use crate::handler::{Api, Target};
use crate::services::ServiceNet;

/// A hook that reads the store (admission that looks at other objects).
pub type Hook<'a> = Pin<Box<dyn Future<Output = Result<(), ApiError>> + Send + 'a>>;

fn done<'a>() -> Hook<'a> {
    Box::pin(async { Ok(()) })
}

/// The special behaviour of one kind. The defaults are what every other kind does.
pub trait Strategy: Sync {
    // Create and update.

    /// Kubernetes' message when `name` is not a valid name for this kind, or None. Most kinds
    /// take DNS subdomains.
    fn check_name(&self, name: &str) -> Option<String> {
        crate::admission::check_subdomain(name)
    }

    /// Top-level fields that hold raw JSON (runtime.RawExtension), stored as sent: the nulls
    /// that are dropped everywhere else (a null is an absent field of a typed object) stay.
    fn raw_fields(&self) -> &'static [&'static str] {
        &[]
    }

    /// Fills in the kind's defaults (Kubernetes' SetDefaults_<Kind>) on a new or updated object.
    fn defaults(&self, _object: &mut Value) {}

    /// Clears the fields of features that are off by default in Kubernetes 1.32 (alpha
    /// gates), as kube-apiserver's dropDisabledFields does on create and update: the field is
    /// dropped without an error unless `old` (the stored object, on update) already uses it.
    /// After the defaults, before validation.
    fn drop_disabled_fields(&self, _old: Option<&Value>, _new: &mut Value) {}

    /// Adds the kind's validation failures (its spec's rules) to `causes`.
    fn validate(&self, _object: &Value, _causes: &mut Vec<Cause>) {}

    // Create.

    /// What the requesting user decides on a new object a client sends (who asked for a
    /// certificate), and the checks that go with it; before the generic create, and only for
    /// clients' requests (not the server's own objects, nor server-side apply).
    fn prepare_for_user(&self, _user: &User, _object: &mut Value) -> Result<(), ApiError> {
        Ok(())
    }

    /// Admission of a new object that reads other objects (a pod's LimitRange and priority),
    /// once, before validation.
    fn admit_create<'a>(
        &'a self,
        _api: &'a Api,
        _t: &'a Target,
        _object: &'a mut Value,
    ) -> Hook<'a> {
        done()
    }

    /// Server-computed fields of a new object, on every attempt to store it (a quota's status
    /// from what its namespace holds at that moment).
    fn prepare_for_store<'a>(
        &'a self,
        _api: &'a Api,
        _t: &'a Target,
        _object: &'a mut Value,
    ) -> Hook<'a> {
        done()
    }

    // Update.

    /// Keeps on an updated object what the server set and the client may not drop (a
    /// Service's allocated addresses).
    fn prepare_for_update(&self, _current: &Value, _new: &mut Value) {}

    /// The part of the object whose changes count in `metadata.generation` (for kinds that
    /// count them: `Resource::has_spec`): the spec, or a PodTemplate's template.
    fn generation_source<'a>(&self, object: &'a Value) -> Option<&'a Value> {
        object.get("spec")
    }

    /// Adds the failures of an update (fields that may not change) to `causes`.
    fn validate_update(&self, _current: &Value, _new: &Value, _causes: &mut Vec<Cause>) {}

    /// Admission of an update that reads other objects (a claim's larger request against its
    /// StorageClass), after validation, on every attempt to store it.
    fn admit_update<'a>(
        &'a self,
        _api: &'a Api,
        _t: &'a Target,
        _current: &'a Value,
        _new: &'a Value,
    ) -> Hook<'a> {
        done()
    }

    // Store keys besides the object.

    /// Picks what the object asks the server to pick (a Service's cluster IP and node ports).
    fn allocate(&self, _net: &ServiceNet, _object: &mut Value) -> Result<(), ApiError> {
        Ok(())
    }

    /// The store keys the object holds besides its own (a Service's addresses); a write
    /// claims the new ones and frees the old ones in the same transaction.
    fn claims(&self, _object: &Value) -> Vec<String> {
        Vec::new()
    }

    /// After a write lost its transaction: the error to answer when a claim of `object`
    /// (that `old` did not hold) was taken meanwhile, else Ok (the caller tries again).
    fn check_claims<'a>(
        &'a self,
        _api: &'a Api,
        _object: &'a Value,
        _old: Option<&'a Value>,
    ) -> Hook<'a> {
        done()
    }

    /// Whether the namespace's quotas count objects of this kind.
    fn charged_by_quota(&self) -> bool {
        true
    }

    // Delete.

    /// A 403 when the object named may not be deleted (a namespace the server made).
    fn check_delete(&self, _name: &str) -> Result<(), ApiError> {
        Ok(())
    }

    /// Whether Orphan and Foreground propagation hold the object with a garbage collector
    /// finalizer.
    fn propagation_finalizers(&self) -> bool {
        true
    }

    /// Seconds the object may take to end (a pod's containers stop on its node); 0 deletes
    /// it, or marks it when finalizers hold it.
    fn grace_period(&self, _object: &Value, _requested: Option<i64>) -> i64 {
        0
    }

    /// Whether deletion only marks the object, even without finalizers: a controller
    /// empties it and finishes (a namespace).
    fn finished_by_controller(&self) -> bool {
        false
    }

    /// Whether the object is already marked for deletion with nothing left to shorten.
    fn deletion_marked(&self, object: &Value) -> bool {
        object.pointer("/metadata/deletionTimestamp").is_some()
    }

    /// What else marking the object for deletion changes (a namespace's phase).
    fn mark_for_deletion(&self, _object: &mut Value) {}
}

impl std::fmt::Debug for dyn Strategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Strategy")
    }
}

/// The strategy of kinds with nothing special.
pub struct Generic;

impl Strategy for Generic {}

/// Adds a FieldValueInvalid cause when the field at `ptr` changed, set or cleared
/// (Kubernetes' ValidateImmutableField, for fields that have no default).
pub(crate) fn immutable_even_unset(
    ptr: &str,
    current: &Value,
    new: &Value,
    causes: &mut Vec<Cause>,
) {
    let set = |v: &Value| v.pointer(ptr).filter(|v| !v.is_null()).cloned();
    if set(current) != set(new) {
        causes.push(immutable_cause(ptr, new));
    }
}

/// Adds a FieldValueInvalid cause when the field at `ptr` was set and changed.
pub(crate) fn immutable(ptr: &str, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
    let old = current.pointer(ptr);
    if old.is_some() && old != new.pointer(ptr) {
        causes.push(immutable_cause(ptr, new));
    }
}

fn immutable_cause(ptr: &str, new: &Value) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: ptr.trim_start_matches('/').replace('/', "."),
        message: format!(
            "Invalid value: {}: field is immutable",
            new.pointer(ptr).cloned().unwrap_or(Value::Null)
        ),
    }
}
