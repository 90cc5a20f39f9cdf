//! DaemonSets: Kubernetes' defaults (a RollingUpdate of one unavailable pod at a time, no
//! surge, ten revisions of history, a pod template's defaults) and checks (a selector that
//! matches the template and never changes, pods that restart Always, an update strategy whose
//! numbers allow progress).

use serde_json::{json, Value};

use crate::admission::{
    child, default, default_template, validate_label_selector, validate_template,
};
use crate::error::Cause;

use super::field::{invalid, not_supported, required};
use super::{immutable, Strategy};

pub struct DaemonSet;

const GENERATION: &str = "deprecated.daemonset.template.generation";

impl Strategy for DaemonSet {
    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        // The template's generation, which daemon pods carry as a label (Kubernetes keeps it
        // in this annotation in apps/v1): 1 for a new DaemonSet, counted on update.
        default(
            child(child(o, "metadata"), "annotations"),
            GENERATION,
            json!("1"),
        );
        let spec = child(o, "spec");
        default(spec, "revisionHistoryLimit", json!(10));
        let strategy = child(spec, "updateStrategy");
        default(strategy, "type", json!("RollingUpdate"));
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
            let ru = child(strategy, "rollingUpdate");
            default(ru, "maxUnavailable", json!(1));
            default(ru, "maxSurge", json!(0));
        }
        default_template(spec);
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_label_selector(object, "DaemonSet", causes);
        validate_template(object, causes);
        let policy = object.pointer("/spec/template/spec/restartPolicy");
        if let Some(p) = policy.filter(|p| p.as_str() != Some("Always")) {
            causes.push(not_supported(
                "spec.template.spec.restartPolicy",
                p,
                &["Always"],
            ));
        }
        for field in ["revisionHistoryLimit", "minReadySeconds"] {
            if let Some(v) = object.pointer(&format!("/spec/{field}")) {
                if v.as_i64().is_none_or(|n| n < 0) {
                    causes.push(invalid(
                        &format!("spec.{field}"),
                        v,
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        validate_update_strategy(object.pointer("/spec/updateStrategy"), causes);
    }

    fn prepare_for_update(&self, current: &Value, new: &mut Value) {
        let generation = current
            .pointer(&format!(
                "/metadata/annotations/{}",
                GENERATION.replace('/', "~1")
            ))
            .and_then(Value::as_str)
            .and_then(|g| g.parse::<i64>().ok())
            .unwrap_or(1);
        // Compared as stored: the new template with its defaults.
        let mut defaulted = new.clone();
        self.defaults(&mut defaulted);
        let changed = current.pointer("/spec/template") != defaulted.pointer("/spec/template");
        let generation = if changed { generation + 1 } else { generation };
        if let Some(o) = new.as_object_mut() {
            child(child(o, "metadata"), "annotations")
                .insert(GENERATION.into(), json!(generation.to_string()));
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/spec/selector", current, new, causes);
    }
}

/// An int-or-percent of a rolling update: a non-negative integer, or a whole percentage of at
/// most 100%. Answers the value as a number of percent-or-count, None when invalid (a cause
/// added).
pub(super) fn int_or_percent(field: &str, v: &Value, causes: &mut Vec<Cause>) -> Option<i64> {
    let n = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => match s.strip_suffix('%').map(str::parse::<i64>) {
            Some(Ok(p)) if p > 100 => {
                causes.push(invalid(field, v, "must not be greater than 100%"));
                return None;
            }
            Some(Ok(p)) => Some(p),
            _ => {
                causes.push(invalid(
                    field,
                    v,
                    "a valid percent string must be a numeric string followed by an ending '%' \
                     (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                ));
                return None;
            }
        },
        _ => None,
    };
    match n {
        Some(n) if n >= 0 => Some(n),
        _ => {
            causes.push(invalid(field, v, "must be greater than or equal to 0"));
            None
        }
    }
}

fn validate_update_strategy(strategy: Option<&Value>, causes: &mut Vec<Cause>) {
    let Some(strategy) = strategy else {
        return;
    };
    let kind = strategy.get("type").cloned().unwrap_or(json!(""));
    match kind.as_str() {
        Some("OnDelete") => {}
        Some("RollingUpdate") => {
            let Some(ru) = strategy.get("rollingUpdate") else {
                causes.push(required("spec.updateStrategy.rollingUpdate", ""));
                return;
            };
            let number = |name: &str, causes: &mut Vec<Cause>| {
                ru.get(name).map(|v| {
                    int_or_percent(
                        &format!("spec.updateStrategy.rollingUpdate.{name}"),
                        v,
                        causes,
                    )
                })
            };
            let unavailable = number("maxUnavailable", causes);
            let surge = number("maxSurge", causes);
            if let (Some(Some(0)), Some(Some(0)) | None) = (unavailable, surge) {
                causes.push(invalid(
                    "spec.updateStrategy.rollingUpdate.maxUnavailable",
                    &ru["maxUnavailable"],
                    "may not be 0 when `maxSurge` is 0",
                ));
            }
        }
        _ => causes.push(not_supported(
            "spec.updateStrategy.type",
            &kind,
            &["OnDelete", "RollingUpdate"],
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(extra: Value) -> Value {
        let mut d = json!({"metadata": {"name": "agent"}, "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                         "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}});
        if let (Some(spec), Some(extra)) = (d["spec"].as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        d
    }

    #[test]
    fn defaults_are_kubernetes_ones() {
        let mut d = ds(json!({}));
        DaemonSet.defaults(&mut d);
        assert_eq!(
            d["spec"]["updateStrategy"],
            json!({"type": "RollingUpdate",
                   "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}})
        );
        assert_eq!(d["spec"]["revisionHistoryLimit"], 10);
        assert_eq!(d["spec"]["template"]["spec"]["restartPolicy"], "Always");
        let mut on_delete = ds(json!({"updateStrategy": {"type": "OnDelete"}}));
        DaemonSet.defaults(&mut on_delete);
        assert_eq!(
            on_delete["spec"]["updateStrategy"],
            json!({"type": "OnDelete"})
        );
    }

    #[test]
    fn validation_refuses_what_kubernetes_refuses() {
        // (spec fields, the fields refused)
        let cases = [
            (json!({}), vec![]),
            (
                json!({"updateStrategy": {"type": "Sometimes"}}),
                vec!["spec.updateStrategy.type"],
            ),
            (
                json!({"updateStrategy": {"type": "RollingUpdate",
                       "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 0}}}),
                vec!["spec.updateStrategy.rollingUpdate.maxUnavailable"],
            ),
            (
                json!({"updateStrategy": {"type": "RollingUpdate",
                       "rollingUpdate": {"maxUnavailable": 0, "maxSurge": "20%"}}}),
                vec![],
            ),
            (
                json!({"updateStrategy": {"type": "RollingUpdate",
                       "rollingUpdate": {"maxUnavailable": "120%", "maxSurge": -1}}}),
                vec![
                    "spec.updateStrategy.rollingUpdate.maxUnavailable",
                    "spec.updateStrategy.rollingUpdate.maxSurge",
                ],
            ),
            (
                json!({"revisionHistoryLimit": -1}),
                vec!["spec.revisionHistoryLimit"],
            ),
        ];
        for (extra, want) in cases {
            let mut d = ds(extra.clone());
            DaemonSet.defaults(&mut d);
            let mut causes = Vec::new();
            DaemonSet.validate(&d, &mut causes);
            let got: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
            assert_eq!(got, want, "{extra}: {causes:?}");
        }
        let mut never = ds(json!({}));
        never["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        let mut causes = Vec::new();
        DaemonSet.validate(&never, &mut causes);
        assert_eq!(
            causes[0].message,
            "Unsupported value: \"Never\": supported values: \"Always\""
        );
    }

    #[test]
    fn the_template_generation_counts_template_changes() {
        let mut current = ds(json!({}));
        DaemonSet.defaults(&mut current);
        assert_eq!(current["metadata"]["annotations"][GENERATION], "1");
        // The same template as a client sends it (without defaults), then another one.
        let mut same = ds(json!({}));
        DaemonSet.prepare_for_update(&current, &mut same);
        assert_eq!(same["metadata"]["annotations"][GENERATION], "1");
        let mut other = ds(json!({}));
        other["spec"]["template"]["spec"]["containers"][0]["image"] = json!("busybox:2");
        DaemonSet.prepare_for_update(&current, &mut other);
        assert_eq!(other["metadata"]["annotations"][GENERATION], "2");
    }

    #[test]
    fn the_selector_never_changes() {
        let old = ds(json!({}));
        let mut new = old.clone();
        new["spec"]["selector"] = json!({"matchLabels": {"app": "other"}});
        let mut causes = Vec::new();
        DaemonSet.validate_update(&old, &new, &mut causes);
        assert_eq!(causes[0].field, "spec.selector");
    }
}
