//! StatefulSets: Kubernetes' defaults (one replica, OrderedReady pod management, a
//! RollingUpdate from partition 0, ten revisions of history, PVCs retained on deletion and on
//! scale-down, a pod template's defaults) and checks (a selector that matches the template,
//! pods that restart Always, known policies, and a spec of which only replicas, ordinals,
//! template, updateStrategy, persistentVolumeClaimRetentionPolicy and minReadySeconds change).
//! `rollingUpdate.maxUnavailable` is dropped, as 1.32 drops it with its alpha gate off.

use serde_json::{json, Value};

use crate::admission::{
    child, default, default_template, validate_label_selector, validate_replicas, validate_template,
};
use crate::error::Cause;

use super::daemonset::int_or_percent;
use super::field::{dns_subdomain, forbidden, invalid, not_supported, required};
use super::Strategy;

pub struct StatefulSet;

/// The spec fields an update may change (Kubernetes' ValidateStatefulSetUpdate).
const MUTABLE: &[&str] = &[
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

impl Strategy for StatefulSet {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "replicas", json!(1));
        default(spec, "podManagementPolicy", json!("OrderedReady"));
        default(spec, "revisionHistoryLimit", json!(10));
        let strategy = child(spec, "updateStrategy");
        default(strategy, "type", json!("RollingUpdate"));
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            default(child(strategy, "rollingUpdate"), "partition", json!(0));
        }
        let retention = child(spec, "persistentVolumeClaimRetentionPolicy");
        default(retention, "whenDeleted", json!("Retain"));
        default(retention, "whenScaled", json!("Retain"));
        default_template(spec);
        // A claim template defaults as a PersistentVolumeClaim does (Kubernetes shows the
        // Pending phase in the set's templates too).
        if let Some(claims) = spec
            .get_mut("volumeClaimTemplates")
            .and_then(Value::as_array_mut)
        {
            for claim in claims.iter_mut() {
                super::persistentvolumeclaim::PersistentVolumeClaim.defaults(claim);
            }
        }
    }

    /// `updateStrategy.rollingUpdate.maxUnavailable` is behind MaxUnavailableStatefulSet,
    /// alpha and off in 1.32: a new set loses it, as does an update of a set that did not
    /// have it already.
    fn drop_disabled_fields(&self, old: Option<&Value>, new: &mut Value) {
        const MAX_UNAVAILABLE: &str = "/spec/updateStrategy/rollingUpdate/maxUnavailable";
        if old.is_some_and(|o| o.pointer(MAX_UNAVAILABLE).is_some()) {
            return;
        }
        if let Some(rolling) = new
            .pointer_mut("/spec/updateStrategy/rollingUpdate")
            .and_then(Value::as_object_mut)
        {
            rolling.shift_remove("maxUnavailable");
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_replicas(object, causes);
        validate_label_selector(object, "StatefulSet", causes);
        validate_template(object, causes);
        let spec = object.get("spec").cloned().unwrap_or(json!({}));
        match spec.get("podManagementPolicy") {
            None => causes.push(required("spec.podManagementPolicy", "")),
            Some(p) if matches!(p.as_str(), Some("OrderedReady" | "Parallel")) => {}
            Some(p) => causes.push(invalid(
                "spec.podManagementPolicy",
                p,
                "must be 'OrderedReady' or 'Parallel'",
            )),
        }
        validate_update_strategy(spec.get("updateStrategy"), causes);
        for which in ["whenDeleted", "whenScaled"] {
            let field = format!("spec.persistentVolumeClaimRetentionPolicy.{which}");
            match spec.pointer(&format!("/persistentVolumeClaimRetentionPolicy/{which}")) {
                Some(p) if matches!(p.as_str(), Some("Retain" | "Delete")) => {}
                Some(p) => causes.push(not_supported(&field, p, &["Retain", "Delete"])),
                None => causes.push(not_supported(&field, &json!(""), &["Retain", "Delete"])),
            }
        }
        for (ptr, field) in [
            ("/minReadySeconds", "spec.minReadySeconds"),
            ("/revisionHistoryLimit", "spec.revisionHistoryLimit"),
            ("/ordinals/start", "spec.ordinals.start"),
        ] {
            if let Some(v) = spec.pointer(ptr) {
                if v.as_i64().is_none_or(|n| n < 0) {
                    causes.push(invalid(field, v, "must be greater than or equal to 0"));
                }
            }
        }
        if let Some(p) = spec
            .pointer("/template/spec/restartPolicy")
            .filter(|p| p.as_str() != Some("Always"))
        {
            causes.push(not_supported(
                "spec.template.spec.restartPolicy",
                p,
                &["Always"],
            ));
        }
        if spec
            .pointer("/template/spec/activeDeadlineSeconds")
            .is_some()
        {
            causes.push(forbidden(
                "spec.template.spec.activeDeadlineSeconds",
                "activeDeadlineSeconds in StatefulSet is not Supported",
            ));
        }
        let claims = spec
            .get("volumeClaimTemplates")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (i, claim) in claims.iter().enumerate() {
            let field = format!("spec.volumeClaimTemplates[{i}].metadata.name");
            match claim.pointer("/metadata/name").and_then(Value::as_str) {
                None | Some("") => {
                    causes.push(required(&field, "name or generateName is required"))
                }
                Some(n) => dns_subdomain(&field, n, causes),
            }
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        let fixed = |o: &Value| {
            let mut spec = o.get("spec").cloned().unwrap_or(json!({}));
            if let Some(m) = spec.as_object_mut() {
                for field in MUTABLE {
                    m.shift_remove(*field);
                }
            }
            spec
        };
        if fixed(current) != fixed(new) {
            causes.push(forbidden(
                "spec",
                "updates to statefulset spec for fields other than 'replicas', 'ordinals', \
                 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' and \
                 'minReadySeconds' are forbidden",
            ));
        }
    }
}

fn validate_update_strategy(strategy: Option<&Value>, causes: &mut Vec<Cause>) {
    let kind = strategy.and_then(|s| s.get("type"));
    let rolling = strategy.and_then(|s| s.get("rollingUpdate"));
    match kind.and_then(Value::as_str) {
        None | Some("") => causes.push(required("spec.updateStrategy", "")),
        Some("OnDelete") => {
            if let Some(r) = rolling {
                causes.push(invalid(
                    "spec.updateStrategy.rollingUpdate",
                    r,
                    "only allowed for updateStrategy 'RollingUpdate'",
                ));
            }
        }
        Some("RollingUpdate") => {
            let Some(r) = rolling else {
                return;
            };
            if let Some(p) = r.get("partition") {
                if p.as_i64().is_none_or(|n| n < 0) {
                    causes.push(invalid(
                        "spec.updateStrategy.rollingUpdate.partition",
                        p,
                        "must be greater than or equal to 0",
                    ));
                }
            }
            if let Some(m) = r.get("maxUnavailable") {
                let field = "spec.updateStrategy.rollingUpdate.maxUnavailable";
                if int_or_percent(field, m, causes) == Some(0) {
                    causes.push(invalid(field, m, "must be greater than 0"));
                }
            }
        }
        Some(_) => causes.push(invalid(
            "spec.updateStrategy",
            strategy.unwrap_or(&Value::Null),
            "must be 'RollingUpdate' or 'OnDelete'",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts(extra: Value) -> Value {
        let mut s = json!({"metadata": {"name": "web"}, "spec": {
            "serviceName": "nginx",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}});
        if let (Some(spec), Some(extra)) = (s["spec"].as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        StatefulSet.defaults(&mut s);
        s
    }

    fn causes(o: &Value) -> Vec<String> {
        let mut causes = Vec::new();
        StatefulSet.validate(o, &mut causes);
        causes
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn defaults_are_kubernetes_ones() {
        let s = sts(json!({}));
        assert_eq!(s["spec"]["replicas"], 1);
        assert_eq!(s["spec"]["podManagementPolicy"], "OrderedReady");
        assert_eq!(s["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(
            s["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
        );
        assert_eq!(
            s["spec"]["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        assert_eq!(s["spec"]["template"]["spec"]["restartPolicy"], "Always");
        let claimed = sts(
            json!({"volumeClaimTemplates": [{"metadata": {"name": "www"},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}]}),
        );
        let template = &claimed["spec"]["volumeClaimTemplates"][0];
        assert_eq!(template["spec"]["volumeMode"], "Filesystem");
        assert_eq!(template["status"]["phase"], "Pending");
        let on_delete = sts(json!({"updateStrategy": {"type": "OnDelete"}}));
        assert_eq!(
            on_delete["spec"]["updateStrategy"],
            json!({"type": "OnDelete"})
        );
        assert!(causes(&sts(json!({}))).is_empty());
    }

    #[test]
    fn bad_specs_get_kubernetes_messages() {
        let cases = [
            (
                json!({"podManagementPolicy": "Whenever"}),
                r#"spec.podManagementPolicy: Invalid value: "Whenever": must be 'OrderedReady' or 'Parallel'"#,
            ),
            (
                json!({"updateStrategy": {"type": "OnDelete", "rollingUpdate": {"partition": 1}}}),
                r#"spec.updateStrategy.rollingUpdate: Invalid value: {"partition":1}: only allowed for updateStrategy 'RollingUpdate'"#,
            ),
            (
                json!({"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": -1}}}),
                "spec.updateStrategy.rollingUpdate.partition: Invalid value: -1: must be greater than or equal to 0",
            ),
            (
                json!({"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Keep"}}),
                r#"spec.persistentVolumeClaimRetentionPolicy.whenDeleted: Unsupported value: "Keep": supported values: "Retain", "Delete""#,
            ),
            (
                json!({"ordinals": {"start": -2}}),
                "spec.ordinals.start: Invalid value: -2: must be greater than or equal to 0",
            ),
        ];
        for (extra, want) in cases {
            let got = causes(&sts(extra.clone()));
            assert_eq!(got, [want], "{extra}");
        }
    }

    #[test]
    fn max_unavailable_is_dropped_unless_the_stored_set_has_it() {
        let rolling = |extra: Value| {
            let mut s = sts(json!({"updateStrategy": {"type": "RollingUpdate",
                "rollingUpdate": extra}}));
            StatefulSet.drop_disabled_fields(None, &mut s);
            s
        };
        let created = rolling(json!({"partition": 1, "maxUnavailable": 2}));
        assert_eq!(
            created["spec"]["updateStrategy"]["rollingUpdate"],
            json!({"partition": 1})
        );
        // Dropped before validation: even a value the validation refuses is no error.
        assert!(causes(&rolling(json!({"maxUnavailable": 0}))).is_empty());
        // A set stored with it (by a server that had the gate on) keeps it on update.
        let mut stored = sts(json!({"updateStrategy": {"type": "RollingUpdate",
            "rollingUpdate": {"partition": 0, "maxUnavailable": 2}}}));
        let mut updated = stored.clone();
        updated["spec"]["replicas"] = json!(5);
        StatefulSet.drop_disabled_fields(Some(&stored), &mut updated);
        assert_eq!(
            updated["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
            2
        );
        stored["spec"]["updateStrategy"]["rollingUpdate"] = json!({"partition": 0});
        StatefulSet.drop_disabled_fields(Some(&stored), &mut updated);
        assert!(updated
            .pointer("/spec/updateStrategy/rollingUpdate/maxUnavailable")
            .is_none());
    }

    #[test]
    fn only_some_spec_fields_may_change() {
        let old = sts(json!({}));
        let mut causes = Vec::new();
        let scaled = sts(
            json!({"replicas": 5, "updateStrategy": {"type": "OnDelete"},
                                "minReadySeconds": 3}),
        );
        StatefulSet.validate_update(&old, &scaled, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        let renamed = sts(json!({"serviceName": "other"}));
        StatefulSet.validate_update(&old, &renamed, &mut causes);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec");
        assert_eq!(
            causes[0].message,
            "Forbidden: updates to statefulset spec for fields other than 'replicas', \
             'ordinals', 'template', 'updateStrategy', 'persistentVolumeClaimRetentionPolicy' \
             and 'minReadySeconds' are forbidden"
        );
    }
}
