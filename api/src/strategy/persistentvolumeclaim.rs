//! PersistentVolumeClaims: a namespace's request for storage (size, access modes, class),
//! bound by the PV binder to one PersistentVolume. Defaults as Kubernetes fills them (volume
//! mode Filesystem, phase Pending), kube-apiserver's validation, the spec fixed after creation
//! except what Kubernetes lets change (a larger request once bound, the volume name and the
//! class while unset), and two admissions of a new claim: DefaultStorageClass (a claim that
//! names no class gets the default one) and StorageObjectInUseProtection (the
//! `kubernetes.io/pvc-protection` finalizer, lifted once no pod uses the claim).

use serde_json::{json, Value};

use crate::admission::{child, default};
use crate::error::{ApiError, Cause};
use crate::handler::{Api, Target};
use crate::resources;
use crate::storage::{decode, Freshness};

use super::field::{
    dns_subdomain, forbidden, invalid, items, label_selector, not_supported, required, str_of,
};
use super::persistentvolume::{access_modes, add_finalizer, VOLUME_MODES};
use super::storageclass::is_default;
use super::{Hook, Strategy};

pub struct PersistentVolumeClaim;

/// The finalizer that keeps a claim in use by a pod from going away under it.
pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// The beta annotation that names a claim's class instead of `spec.storageClassName`.
const BETA_CLASS_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-class";

fn storage_request(o: &Value) -> Option<&Value> {
    o.pointer("/spec/resources/requests/storage")
}

fn quantity(v: Option<&Value>) -> Option<i128> {
    v.and_then(Value::as_str)
        .and_then(rkube_core::quantity::parse_quantity)
}

impl Strategy for PersistentVolumeClaim {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        default(child(o, "spec"), "volumeMode", json!("Filesystem"));
        default(child(o, "status"), "phase", json!("Pending"));
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        access_modes(
            items(spec, "accessModes"),
            "spec.accessModes",
            "at least 1 access mode is required",
            causes,
        );
        match storage_request(object) {
            None => causes.push(required("spec.resources[storage]", "")),
            Some(q) => match quantity(Some(q)) {
                Some(n) if n > 0 => {}
                _ => causes.push(invalid(
                    "spec.resources[storage]",
                    q,
                    "must be greater than zero",
                )),
            },
        }
        if let Some(m) = spec.and_then(|s| s.get("volumeMode")) {
            if !m.as_str().is_some_and(|m| VOLUME_MODES.contains(&m)) {
                causes.push(not_supported("spec.volumeMode", m, VOLUME_MODES));
            }
        }
        let class = str_of(spec, "storageClassName");
        if !class.is_empty() {
            dns_subdomain("spec.storageClassName", class, causes);
        }
        label_selector(
            "spec.selector",
            spec.and_then(|s| s.get("selector")),
            causes,
        );
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        // What may change: the request once bound, and the volume name and class while unset.
        let mut old_spec = current.get("spec").cloned().unwrap_or(json!({}));
        let new_spec = new.get("spec").cloned().unwrap_or(json!({}));
        let bound = current.pointer("/status/phase").and_then(Value::as_str) == Some("Bound");
        for key in ["volumeName", "storageClassName"] {
            if old_spec
                .get(key)
                .is_none_or(|v| v.as_str() == Some("") && key == "volumeName")
            {
                if let (Some(o), Some(v)) = (old_spec.as_object_mut(), new_spec.get(key)) {
                    o.insert(key.into(), v.clone());
                }
            }
        }
        if bound {
            if let (Some(o), Some(r)) = (old_spec.as_object_mut(), new_spec.get("resources")) {
                o.insert("resources".into(), r.clone());
            }
        }
        if old_spec != new_spec {
            causes.push(forbidden(
                "spec",
                "spec is immutable after creation except resources.requests for bound claims",
            ));
            return;
        }
        if let (Some(old), Some(new_q)) = (
            quantity(storage_request(current)),
            quantity(storage_request(new)),
        ) {
            if new_q < old {
                causes.push(forbidden(
                    "spec.resources.requests.storage",
                    "field can not be less than previous value",
                ));
            }
        }
    }

    /// PersistentVolumeClaimResize: a larger request only for a claim whose class allows
    /// expansion.
    fn admit_update<'a>(
        &'a self,
        api: &'a Api,
        _t: &'a Target,
        current: &'a Value,
        new: &'a Value,
    ) -> Hook<'a> {
        Box::pin(async move {
            let grows = match (
                quantity(storage_request(current)),
                quantity(storage_request(new)),
            ) {
                (Some(old), Some(n)) => n > old,
                _ => false,
            };
            if !grows {
                return Ok(());
            }
            let class = str_of(new.get("spec"), "storageClassName");
            if !class.is_empty() && class_allows_expansion(api, class).await? {
                return Ok(());
            }
            let name = crate::handler::meta_str(new, "name").unwrap_or("");
            Err(ApiError::forbidden(format!(
                "persistentvolumeclaims \"{name}\" is forbidden: only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"
            )))
        })
    }

    /// DefaultStorageClass and StorageObjectInUseProtection.
    fn admit_create<'a>(&'a self, api: &'a Api, _t: &'a Target, pvc: &'a mut Value) -> Hook<'a> {
        Box::pin(async move {
            add_finalizer(pvc, PVC_PROTECTION);
            let named = pvc.pointer("/spec/storageClassName").is_some()
                || pvc
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(BETA_CLASS_ANNOTATION))
                    .is_some();
            if named {
                return Ok(());
            }
            if let Some(class) = default_class(api).await? {
                crate::value::set(pvc, &["spec", "storageClassName"], json!(class));
            }
            Ok(())
        })
    }
}

/// Whether a StorageClass exists and says `allowVolumeExpansion: true`.
async fn class_allows_expansion(api: &Api, class: &str) -> Result<bool, ApiError> {
    let res = resources::find("storage.k8s.io", "v1", "storageclasses")
        .ok_or_else(|| ApiError::internal("storageclasses are served"))?;
    let stored = api
        .store
        .get(&res.key(None, class), Freshness::Latest)
        .await?;
    Ok(stored
        .and_then(|s| {
            s.object
                .get("allowVolumeExpansion")
                .and_then(Value::as_bool)
        })
        .unwrap_or(false))
}

/// The StorageClass claims that name none get: of the classes marked default, the newest
/// (by creation time, then name), as Kubernetes picks since 1.28.
pub async fn default_class(api: &Api) -> Result<Option<String>, ApiError> {
    let res = resources::find("storage.k8s.io", "v1", "storageclasses")
        .ok_or_else(|| ApiError::internal("storageclasses are served"))?;
    let prefix = res.prefix(None);
    let end = rkube_store::mvcc::types::prefix_end(prefix.as_bytes());
    let (kvs, _, _) = api.store.range(&prefix, &end, 0, Freshness::Any).await?;
    let mut marked = Vec::new();
    for kv in &kvs {
        let class = decode(kv)?.object;
        if is_default(&class) {
            marked.push(class);
        }
    }
    Ok(pick_default(&marked))
}

/// The newest of the default classes; equal times go to the first name.
fn pick_default(marked: &[Value]) -> Option<String> {
    let key = |c: &Value| {
        (
            c.pointer("/metadata/creationTimestamp")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            std::cmp::Reverse(
                c.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            ),
        )
    };
    marked
        .iter()
        .max_by_key(|c| key(c))
        .and_then(|c| c.pointer("/metadata/name").and_then(Value::as_str))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvc(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "data", "namespace": "default"}, "spec": spec})
    }

    fn errors(o: &Value) -> Vec<String> {
        let mut causes = Vec::new();
        PersistentVolumeClaim.validate(o, &mut causes);
        causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn validation_words_kubernetes_errors() {
        assert_eq!(
            errors(&pvc(json!({}))),
            vec![
                "spec.accessModes: Required value: at least 1 access mode is required",
                "spec.resources[storage]: Required value",
            ]
        );
        assert_eq!(
            errors(&pvc(json!({"accessModes": ["ReadWriteOnce"],
                               "resources": {"requests": {"storage": "0"}}}))),
            vec![r#"spec.resources[storage]: Invalid value: "0": must be greater than zero"#]
        );
        let mut ok = pvc(json!({"accessModes": ["ReadWriteOnce"],
                                "resources": {"requests": {"storage": "1Gi"}}}));
        PersistentVolumeClaim.defaults(&mut ok);
        assert_eq!(ok["spec"]["volumeMode"], "Filesystem");
        assert_eq!(ok["status"]["phase"], "Pending");
        assert!(errors(&ok).is_empty());
    }

    #[test]
    fn spec_is_fixed_except_growth_when_bound_and_unset_names() {
        let old = pvc(
            json!({"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                             "resources": {"requests": {"storage": "1Gi"}}}),
        );
        let check = |current: &Value, new: &Value| {
            let mut causes = Vec::new();
            PersistentVolumeClaim.validate_update(current, new, &mut causes);
            causes
                .iter()
                .map(|c| format!("{}: {}", c.field, c.message))
                .collect::<Vec<_>>()
        };
        let mut named = old.clone();
        named["spec"]["volumeName"] = json!("pv1");
        named["spec"]["storageClassName"] = json!("local-path");
        assert!(check(&old, &named).is_empty());
        let mut renamed = named.clone();
        renamed["spec"]["volumeName"] = json!("pv2");
        assert_eq!(
            check(&named, &renamed),
            vec!["spec: Forbidden: spec is immutable after creation except resources.requests for bound claims"]
        );
        let mut grown = old.clone();
        grown["spec"]["resources"]["requests"]["storage"] = json!("2Gi");
        assert_eq!(
            check(&old, &grown).len(),
            1,
            "a pending claim does not grow"
        );
        let mut bound = old.clone();
        bound["status"] = json!({"phase": "Bound"});
        assert!(check(&bound, &grown).is_empty());
        let mut shrunk = old.clone();
        shrunk["spec"]["resources"]["requests"]["storage"] = json!("512Mi");
        assert_eq!(
            check(&bound, &shrunk),
            vec!["spec.resources.requests.storage: Forbidden: field can not be less than previous value"]
        );
    }

    #[test]
    fn the_newest_default_class_wins() {
        let class =
            |name: &str, at: &str| json!({"metadata": {"name": name, "creationTimestamp": at}});
        assert_eq!(pick_default(&[]), None);
        assert_eq!(
            pick_default(&[
                class("old", "2026-01-01T00:00:00Z"),
                class("new", "2026-02-01T00:00:00Z"),
            ]),
            Some("new".into())
        );
        assert_eq!(
            pick_default(&[
                class("b", "2026-01-01T00:00:00Z"),
                class("a", "2026-01-01T00:00:00Z"),
            ]),
            Some("a".into())
        );
    }
}
