//! PersistentVolumes: a piece of storage with its capacity, access modes, class and reclaim
//! policy, bound to at most one claim (`spec.claimRef`). Defaults as Kubernetes fills them
//! (reclaim policy Retain, volume mode Filesystem, phase Pending until the binder looks), the
//! checks of kube-apiserver's validation, and the `kubernetes.io/pv-protection` finalizer a new
//! volume gets (the StorageObjectInUseProtection admission), which the binder lifts once no
//! claim is bound to it.

use serde_json::{json, Value};

use crate::admission::{child, default};
use crate::error::Cause;
use crate::handler::{Api, Target};

use super::field::{dns_subdomain, forbidden, invalid, items, not_supported, required, str_of};
use super::{immutable, Hook, Strategy};

pub struct PersistentVolume;

/// The finalizer that keeps a bound volume from going away under its claim.
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

pub(crate) const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
pub(crate) const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];

/// The volume sources a PersistentVolume may name (exactly one).
const SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// Adds a finalizer to a new object unless it has it.
pub(crate) fn add_finalizer(object: &mut Value, finalizer: &str) {
    let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let list = meta.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(list) = list.as_array_mut() {
        if !list.iter().any(|f| f == finalizer) {
            list.push(json!(finalizer));
        }
    }
}

/// The access modes of a volume or claim: at least one, each known, ReadWriteOncePod alone.
pub(crate) fn access_modes(
    modes: &[Value],
    at: &str,
    required_detail: &str,
    causes: &mut Vec<Cause>,
) {
    if modes.is_empty() {
        causes.push(required(at, required_detail));
    }
    for m in modes {
        if !m.as_str().is_some_and(|m| ACCESS_MODES.contains(&m)) {
            causes.push(not_supported(at, m, ACCESS_MODES));
        }
    }
    if modes.len() > 1 && modes.iter().any(|m| m == "ReadWriteOncePod") {
        causes.push(forbidden(
            at,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

impl Strategy for PersistentVolume {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "persistentVolumeReclaimPolicy", json!("Retain"));
        default(spec, "volumeMode", json!("Filesystem"));
        let status = child(o, "status");
        default(status, "phase", json!("Pending"));
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        access_modes(items(spec, "accessModes"), "spec.accessModes", "", causes);
        let capacity = spec
            .and_then(|s| s.get("capacity"))
            .and_then(Value::as_object);
        match capacity {
            None => {
                causes.push(required("spec.capacity", ""));
                causes.push(not_supported(
                    "spec.capacity",
                    &json!("core.ResourceList(nil)"),
                    &["storage"],
                ));
            }
            Some(c) if !c.contains_key("storage") || c.len() > 1 => {
                let keys: Vec<&str> = c.keys().map(String::as_str).collect();
                causes.push(not_supported(
                    "spec.capacity",
                    &json!(keys.join(",")),
                    &["storage"],
                ));
            }
            Some(c) => {
                let q = c.get("storage").and_then(Value::as_str).unwrap_or("");
                if rkube_core::quantity::parse_quantity(q).is_none_or(|n| n <= 0) {
                    causes.push(invalid(
                        "spec.capacity[storage]",
                        &json!(q),
                        "must be greater than zero",
                    ));
                }
            }
        }
        let named: Vec<&str> = SOURCES
            .iter()
            .copied()
            .filter(|k| spec.and_then(|s| s.get(*k)).is_some())
            .collect();
        match named.as_slice() {
            [] => causes.push(required("spec", "must specify a volume type")),
            [_] => {}
            [_, rest @ ..] => {
                for k in rest {
                    causes.push(forbidden(
                        &format!("spec.{k}"),
                        "may not specify more than 1 volume type",
                    ));
                }
            }
        }
        for k in ["hostPath", "local"] {
            if let Some(source) = spec.and_then(|s| s.get(k)) {
                if str_of(Some(source), "path").is_empty() {
                    causes.push(required(&format!("spec.{k}.path"), ""));
                }
            }
        }
        if spec.and_then(|s| s.get("local")).is_some()
            && spec.and_then(|s| s.get("nodeAffinity")).is_none()
        {
            causes.push(required(
                "spec.nodeAffinity",
                "Local volume requires node affinity",
            ));
        }
        if let Some(p) = spec.and_then(|s| s.get("persistentVolumeReclaimPolicy")) {
            if !p.as_str().is_some_and(|p| RECLAIM_POLICIES.contains(&p)) {
                causes.push(not_supported(
                    "spec.persistentVolumeReclaimPolicy",
                    p,
                    RECLAIM_POLICIES,
                ));
            }
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
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        let source = |o: &Value| -> Vec<(String, Value)> {
            SOURCES
                .iter()
                .filter_map(|k| {
                    o.pointer(&format!("/spec/{k}"))
                        .map(|v| (k.to_string(), v.clone()))
                })
                .collect()
        };
        if source(current) != source(new) {
            causes.push(forbidden(
                "spec.persistentvolumesource",
                "spec.persistentvolumesource is immutable after creation",
            ));
        }
        immutable("/spec/volumeMode", current, new, causes);
        immutable("/spec/nodeAffinity", current, new, causes);
    }

    /// StorageObjectInUseProtection: a new volume is protected while a claim is bound to it.
    fn admit_create<'a>(&'a self, _api: &'a Api, _t: &'a Target, pv: &'a mut Value) -> Hook<'a> {
        add_finalizer(pv, PV_PROTECTION);
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"},
               "spec": spec})
    }

    fn errors(o: &Value) -> Vec<String> {
        let mut causes = Vec::new();
        PersistentVolume.validate(o, &mut causes);
        causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn defaults_retain_filesystem_pending() {
        let mut o = pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                              "hostPath": {"path": "/data"}}),
        );
        PersistentVolume.defaults(&mut o);
        assert_eq!(o["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(o["spec"]["volumeMode"], "Filesystem");
        assert_eq!(o["status"]["phase"], "Pending");
        assert!(errors(&o).is_empty(), "{:?}", errors(&o));
    }

    #[test]
    fn validation_words_kubernetes_errors() {
        assert_eq!(
            errors(&pv(json!({}))),
            vec![
                "spec.accessModes: Required value",
                "spec.capacity: Required value",
                r#"spec.capacity: Unsupported value: "core.ResourceList(nil)": supported values: "storage""#,
                "spec: Required value: must specify a volume type",
            ]
        );
        assert_eq!(
            errors(&pv(json!({"capacity": {"storage": "1Gi"},
                              "accessModes": ["ReadWriteOncePod", "ReadWriteOnce"],
                              "local": {"path": "/d"}, "hostPath": {"path": "/e"}}))),
            vec![
                "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
                "spec.local: Forbidden: may not specify more than 1 volume type",
                "spec.nodeAffinity: Required value: Local volume requires node affinity",
            ]
        );
        assert_eq!(
            errors(&pv(
                json!({"capacity": {"storage": "1Gi"}, "accessModes": ["Sometimes"],
                              "hostPath": {"path": ""},
                              "persistentVolumeReclaimPolicy": "Keep"})
            )),
            vec![
                r#"spec.accessModes: Unsupported value: "Sometimes": supported values: "ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod""#,
                "spec.hostPath.path: Required value",
                r#"spec.persistentVolumeReclaimPolicy: Unsupported value: "Keep": supported values: "Delete", "Recycle", "Retain""#,
            ]
        );
    }

    #[test]
    fn the_source_is_fixed_but_the_claim_may_change() {
        let old = pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                            "hostPath": {"path": "/data"}, "volumeMode": "Filesystem"}),
        );
        let mut bound = old.clone();
        bound["spec"]["claimRef"] = json!({"namespace": "default", "name": "c"});
        bound["spec"]["capacity"]["storage"] = json!("2Gi");
        let mut causes = Vec::new();
        PersistentVolume.validate_update(&old, &bound, &mut causes);
        assert!(causes.is_empty());
        let mut moved = old.clone();
        moved["spec"]["hostPath"]["path"] = json!("/other");
        PersistentVolume.validate_update(&old, &moved, &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec.persistentvolumesource");
    }

    #[test]
    fn finalizer_is_added_once() {
        let mut o = pv(json!({}));
        add_finalizer(&mut o, PV_PROTECTION);
        add_finalizer(&mut o, PV_PROTECTION);
        assert_eq!(o["metadata"]["finalizers"], json!([PV_PROTECTION]));
    }
}
