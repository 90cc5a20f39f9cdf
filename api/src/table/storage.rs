//! The rows of PersistentVolumes, PersistentVolumeClaims and StorageClasses, as kubectl's
//! printers write them (`kubectl get pv,pvc,sc`).

use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use super::format::arr;

/// Access modes as kubectl abbreviates them, in its order, each once.
fn access_modes(modes: &[Value]) -> String {
    [
        ("ReadWriteOnce", "RWO"),
        ("ReadOnlyMany", "ROX"),
        ("ReadWriteMany", "RWX"),
        ("ReadWriteOncePod", "RWOP"),
    ]
    .iter()
    .filter(|(m, _)| modes.iter().any(|x| x == m))
    .map(|(_, short)| *short)
    .collect::<Vec<_>>()
    .join(",")
}

fn unset(v: &str) -> String {
    if v.is_empty() {
        "<unset>".into()
    } else {
        v.into()
    }
}

/// The phase, or Terminating once the object is marked for deletion.
fn phase(o: &Value) -> String {
    if o.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating".into()
    } else {
        s(o, "/status/phase").into()
    }
}

/// A PersistentVolume's cells after the name (Age left null for the caller).
pub(super) fn volume_row(o: &Value) -> Vec<Value> {
    let claim = match o.pointer("/spec/claimRef") {
        Some(c) => format!("{}/{}", s(c, "/namespace"), s(c, "/name")),
        None => String::new(),
    };
    vec![
        json!(s(o, "/spec/capacity/storage")),
        json!(access_modes(arr(o, "/spec/accessModes"))),
        json!(s(o, "/spec/persistentVolumeReclaimPolicy")),
        json!(phase(o)),
        json!(claim),
        json!(s(o, "/spec/storageClassName")),
        json!(unset(s(o, "/spec/volumeAttributesClassName"))),
        json!(s(o, "/status/reason")),
        Value::Null,
        json!(unset(s(o, "/spec/volumeMode"))),
    ]
}

/// A PersistentVolumeClaim's cells after the name: capacity and access modes only once a
/// volume is named.
pub(super) fn claim_row(o: &Value) -> Vec<Value> {
    let volume = s(o, "/spec/volumeName");
    let (capacity, modes) = if volume.is_empty() {
        (String::new(), String::new())
    } else {
        (
            s(o, "/status/capacity/storage").to_string(),
            access_modes(arr(o, "/status/accessModes")),
        )
    };
    vec![
        json!(phase(o)),
        json!(volume),
        json!(capacity),
        json!(modes),
        json!(s(o, "/spec/storageClassName")),
        json!(unset(s(o, "/spec/volumeAttributesClassName"))),
        Value::Null,
        json!(unset(s(o, "/spec/volumeMode"))),
    ]
}

/// A StorageClass's whole row: the default class's name says so.
pub(super) fn class_row(o: &Value) -> Vec<Value> {
    let mut name = s(o, "/metadata/name").to_string();
    if crate::strategy::storageclass::is_default(o) {
        name.push_str(" (default)");
    }
    let or = |ptr: &str, d: &str| {
        let v = s(o, ptr);
        if v.is_empty() {
            d.to_string()
        } else {
            v.to_string()
        }
    };
    vec![
        json!(name),
        json!(s(o, "/provisioner")),
        json!(or("/reclaimPolicy", "Delete")),
        json!(or("/volumeBindingMode", "Immediate")),
        json!(o
            .get("allowVolumeExpansion")
            .and_then(Value::as_bool)
            .unwrap_or(false)),
        Value::Null,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_and_claims_print_as_kubectl() {
        let pv = json!({"metadata": {"name": "pv1"},
            "spec": {"capacity": {"storage": "1Gi"},
                     "accessModes": ["ReadWriteMany", "ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "manual",
                     "claimRef": {"namespace": "default", "name": "data"},
                     "volumeMode": "Filesystem"},
            "status": {"phase": "Bound"}});
        assert_eq!(
            volume_row(&pv),
            vec![
                json!("1Gi"),
                json!("RWO,RWX"),
                json!("Retain"),
                json!("Bound"),
                json!("default/data"),
                json!("manual"),
                json!("<unset>"),
                json!(""),
                Value::Null,
                json!("Filesystem")
            ]
        );
        let pending = json!({"metadata": {"name": "c", "deletionTimestamp": "x"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                     "volumeMode": "Filesystem"},
            "status": {"phase": "Pending"}});
        assert_eq!(
            claim_row(&pending),
            vec![
                json!("Terminating"),
                json!(""),
                json!(""),
                json!(""),
                json!("local-path"),
                json!("<unset>"),
                Value::Null,
                json!("Filesystem")
            ]
        );
        let class = json!({"metadata": {"name": "local-path", "annotations":
                {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"});
        assert_eq!(
            class_row(&class),
            vec![
                json!("local-path (default)"),
                json!("rancher.io/local-path"),
                json!("Delete"),
                json!("WaitForFirstConsumer"),
                json!(false),
                Value::Null
            ]
        );
    }
}
