//! Jobs (batch/v1): Kubernetes' defaults (one completion and one pod at a time, six retries,
//! NonIndexed, not suspended), the selector the server generates from the job's uid with the
//! labels it puts on the pod template, and the rules of `pkg/apis/batch/validation`.

use serde_json::{json, Map, Value};

use crate::admission::{
    child, default, default_template, validate_label_selector, validate_template,
};
use crate::error::Cause;

use super::field::{invalid, not_supported, required};
use super::{immutable, Strategy};

pub struct Job;

/// The label the generated selector matches: the job's uid.
pub const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";
pub const JOB_NAME: &str = "batch.kubernetes.io/job-name";
/// The labels older clients select by, which Kubernetes still sets.
const LEGACY_CONTROLLER_UID: &str = "controller-uid";
const LEGACY_JOB_NAME: &str = "job-name";

impl Strategy for Job {
    fn defaults(&self, object: &mut Value) {
        let uid = object
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let Some(o) = object.as_object_mut() else {
            return;
        };
        default_job_spec(child(o, "spec"));
        let spec = child(o, "spec");
        let manual = spec.get("manualSelector") == Some(&json!(true));
        if !manual && !uid.is_empty() && !spec.contains_key("selector") {
            generate_selector(spec, &uid, &name);
        }
        if !manual {
            default(spec, "manualSelector", json!(false));
        }
        // A job without labels takes its template's (SetDefaults_Job).
        let template_labels = o
            .get("spec")
            .and_then(|s| s.pointer("/template/metadata/labels"))
            .filter(|l| l.as_object().is_some_and(|m| !m.is_empty()))
            .cloned();
        let meta = child(o, "metadata");
        let empty = meta
            .get("labels")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty);
        if let (true, Some(labels)) = (empty, template_labels) {
            meta.insert("labels".into(), labels);
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        validate_job_spec(object.get("spec"), "spec", causes);
        validate_label_selector(object, "Job", causes);
        validate_generated_selector(object, causes);
        validate_template(object, causes);
    }

    fn prepare_for_update(&self, current: &Value, new: &mut Value) {
        // A client that replaces the job without its generated selector keeps it.
        if new.pointer("/spec/selector").is_none() {
            if let Some(sel) = current.pointer("/spec/selector") {
                crate::value::set(new, &["spec", "selector"], sel.clone());
            }
        }
    }

    fn validate_update(&self, current: &Value, new: &Value, causes: &mut Vec<Cause>) {
        immutable("/spec/selector", current, new, causes);
        immutable("/spec/completionMode", current, new, causes);
        immutable("/spec/podFailurePolicy", current, new, causes);
        immutable("/spec/backoffLimitPerIndex", current, new, causes);
        // The template may change only while the job is suspended (and has not started).
        let suspended = current.pointer("/spec/suspend") == Some(&json!(true));
        if !suspended {
            immutable("/spec/template", current, new, causes);
        }
        // Completions change only together with parallelism in an elastic Indexed job.
        let indexed = current.pointer("/spec/completionMode") == Some(&json!("Indexed"));
        let elastic =
            indexed && new.pointer("/spec/completions") == new.pointer("/spec/parallelism");
        if !elastic {
            immutable("/spec/completions", current, new, causes);
        }
    }
}

/// The defaults of a job's spec, also those of a CronJob's job template.
pub(crate) fn default_job_spec(spec: &mut Map<String, Value>) {
    if spec.get("completions").is_none_or(Value::is_null)
        && spec.get("parallelism").is_none_or(Value::is_null)
    {
        spec.insert("completions".into(), json!(1));
    }
    default(spec, "parallelism", json!(1));
    let per_index = spec
        .get("backoffLimitPerIndex")
        .is_some_and(|v| !v.is_null());
    default(
        spec,
        "backoffLimit",
        json!(if per_index { i32::MAX } else { 6 }),
    );
    default(spec, "completionMode", json!("NonIndexed"));
    default(spec, "suspend", json!(false));
    let has_policy = spec.get("podFailurePolicy").is_some_and(Value::is_object);
    if let Some(rules) = spec
        .get_mut("podFailurePolicy")
        .and_then(|p| p.get_mut("rules"))
        .and_then(Value::as_array_mut)
    {
        for rule in rules {
            for pattern in rule
                .get_mut("onPodConditions")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
                .filter_map(Value::as_object_mut)
            {
                default(pattern, "status", json!("True"));
            }
        }
    }
    default(
        spec,
        "podReplacementPolicy",
        json!(if has_policy {
            "Failed"
        } else {
            "TerminatingOrFailed"
        }),
    );
    default_template(spec);
}

/// The selector of the job's uid, and the labels that make the template match it.
fn generate_selector(spec: &mut Map<String, Value>, uid: &str, name: &str) {
    spec.insert(
        "selector".into(),
        json!({"matchLabels": {CONTROLLER_UID: uid}}),
    );
    let labels = child(child(child(spec, "template"), "metadata"), "labels");
    for (k, v) in [
        (CONTROLLER_UID, uid),
        (JOB_NAME, name),
        (LEGACY_CONTROLLER_UID, uid),
        (LEGACY_JOB_NAME, name),
    ] {
        labels.insert(k.into(), json!(v));
    }
}

/// Without `manualSelector`, the selector is the one the server generates from the uid.
fn validate_generated_selector(object: &Value, causes: &mut Vec<Cause>) {
    let manual = object.pointer("/spec/manualSelector") == Some(&json!(true));
    let uid = object.pointer("/metadata/uid").and_then(Value::as_str);
    let (Some(uid), false) = (uid, manual) else {
        return;
    };
    let selector = object.pointer("/spec/selector");
    if selector.is_some_and(|s| *s != json!({"matchLabels": {CONTROLLER_UID: uid}})) {
        causes.push(invalid(
            "spec.selector",
            selector.unwrap_or(&Value::Null),
            "`selector` not auto-generated",
        ));
    }
}

fn non_negative(spec: Option<&Value>, at: &str, key: &str, causes: &mut Vec<Cause>) {
    if let Some(v) = spec.and_then(|s| s.get(key)) {
        if v.as_i64().is_none_or(|n| n < 0) {
            causes.push(invalid(
                &format!("{at}.{key}"),
                v,
                "must be greater than or equal to 0",
            ));
        }
    }
}

/// The rules of a job's spec (`at` is `spec`, or `spec.jobTemplate.spec` in a CronJob).
pub(crate) fn validate_job_spec(spec: Option<&Value>, at: &str, causes: &mut Vec<Cause>) {
    for key in [
        "parallelism",
        "completions",
        "backoffLimit",
        "ttlSecondsAfterFinished",
        "backoffLimitPerIndex",
        "maxFailedIndexes",
    ] {
        non_negative(spec, at, key, causes);
    }
    if let Some(v) = spec.and_then(|s| s.get("activeDeadlineSeconds")) {
        if v.as_i64().is_none_or(|n| n <= 0) {
            causes.push(invalid(
                &format!("{at}.activeDeadlineSeconds"),
                v,
                "must be greater than 0",
            ));
        }
    }
    let mode = spec
        .and_then(|s| s.get("completionMode"))
        .cloned()
        .unwrap_or(json!("NonIndexed"));
    if !["NonIndexed", "Indexed"].contains(&mode.as_str().unwrap_or("")) {
        causes.push(not_supported(
            &format!("{at}.completionMode"),
            &mode,
            &["NonIndexed", "Indexed"],
        ));
    }
    let indexed = mode == json!("Indexed");
    if indexed && spec.and_then(|s| s.get("completions")).is_none() {
        causes.push(required(
            &format!("{at}.completions"),
            "when completion mode is Indexed",
        ));
    }
    for key in ["backoffLimitPerIndex", "maxFailedIndexes"] {
        if !indexed && spec.and_then(|s| s.get(key)).is_some() {
            causes.push(invalid(
                &format!("{at}.{key}"),
                spec.and_then(|s| s.get(key)).unwrap_or(&Value::Null),
                "requires indexed completion mode",
            ));
        }
    }
    let policy = spec
        .and_then(|s| s.pointer("/template/spec/restartPolicy"))
        .cloned()
        .unwrap_or(json!("Always"));
    if !["OnFailure", "Never"].contains(&policy.as_str().unwrap_or("")) {
        causes.push(not_supported(
            &format!("{at}.template.spec.restartPolicy"),
            &policy,
            &["OnFailure", "Never"],
        ));
    }
    let rules = spec
        .and_then(|s| s.pointer("/podFailurePolicy/rules"))
        .and_then(Value::as_array);
    if rules.is_some() && policy == json!("OnFailure") {
        causes.push(invalid(
            &format!("{at}.template.spec.restartPolicy"),
            &policy,
            "only \"Never\" is supported when podFailurePolicy is specified",
        ));
    }
    for (i, rule) in rules.into_iter().flatten().enumerate() {
        let r = format!("{at}.podFailurePolicy.rules[{i}]");
        let action = rule.get("action").cloned().unwrap_or(json!(""));
        let actions = ["Count", "FailIndex", "FailJob", "Ignore"];
        if !actions.contains(&action.as_str().unwrap_or("")) {
            causes.push(not_supported(&format!("{r}.action"), &action, &actions));
        }
        let codes = rule.get("onExitCodes");
        let conditions = rule.get("onPodConditions");
        if codes.is_some() == conditions.is_some() {
            causes.push(invalid(
                &r,
                &Value::Null,
                "specifying one of OnExitCodes and OnPodConditions is required",
            ));
        }
        if let Some(c) = codes {
            let op = c.get("operator").cloned().unwrap_or(json!(""));
            if !["In", "NotIn"].contains(&op.as_str().unwrap_or("")) {
                causes.push(not_supported(
                    &format!("{r}.onExitCodes.operator"),
                    &op,
                    &["In", "NotIn"],
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(spec: Value) -> Value {
        json!({"metadata": {"name": "pi", "uid": "u-1"}, "spec": spec})
    }

    fn template() -> Value {
        json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}})
    }

    #[test]
    fn defaults_generate_the_selector_and_labels() {
        let mut j = job(json!({"template": template()}));
        Job.defaults(&mut j);
        let spec = &j["spec"];
        assert_eq!(spec["completions"], 1);
        assert_eq!(spec["parallelism"], 1);
        assert_eq!(spec["backoffLimit"], 6);
        assert_eq!(spec["completionMode"], "NonIndexed");
        assert_eq!(spec["suspend"], false);
        assert_eq!(spec["manualSelector"], false);
        assert_eq!(spec["podReplacementPolicy"], "TerminatingOrFailed");
        assert_eq!(
            spec["selector"],
            json!({"matchLabels": {CONTROLLER_UID: "u-1"}})
        );
        let labels = &spec["template"]["metadata"]["labels"];
        assert_eq!(labels[JOB_NAME], "pi");
        assert_eq!(labels["controller-uid"], "u-1");
        assert_eq!(j["metadata"]["labels"], *labels);
        let mut causes = Vec::new();
        Job.validate(&j, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn parallelism_alone_leaves_completions_unset_and_per_index_limits_lift_the_backoff() {
        let mut j = job(json!({"parallelism": 3, "template": template()}));
        Job.defaults(&mut j);
        assert!(j["spec"].get("completions").is_none());
        let mut j = job(json!({"completions": 3, "completionMode": "Indexed",
            "backoffLimitPerIndex": 1, "template": template()}));
        Job.defaults(&mut j);
        assert_eq!(j["spec"]["backoffLimit"], i32::MAX);
    }

    #[test]
    fn validation() {
        let always = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
        for (spec, field, message) in [
            (
                json!({"template": always}),
                "spec.template.spec.restartPolicy",
                "Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\"",
            ),
            (
                json!({"completionMode": "Indexed", "parallelism": 2, "template": template()}),
                "spec.completions",
                "Required value: when completion mode is Indexed",
            ),
            (
                json!({"backoffLimit": -1, "template": template()}),
                "spec.backoffLimit",
                "Invalid value: -1: must be greater than or equal to 0",
            ),
        ] {
            let mut j = job(spec);
            Job.defaults(&mut j);
            if field == "spec.template.spec.restartPolicy" {
                // The pod defaults would say Always.
                j["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
            }
            let mut causes = Vec::new();
            Job.validate(&j, &mut causes);
            assert!(
                causes
                    .iter()
                    .any(|c| c.field == field && c.message == message),
                "{field}: {causes:?}"
            );
        }
    }

    #[test]
    fn a_selector_of_ones_own_needs_manual_selector() {
        let sel = json!({"matchLabels": {"app": "x"}});
        let mut t = template();
        t["metadata"] = json!({"labels": {"app": "x"}});
        let mut j = job(json!({"selector": sel, "template": t}));
        Job.defaults(&mut j);
        let mut causes = Vec::new();
        Job.validate(&j, &mut causes);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert!(causes[0].message.ends_with("`selector` not auto-generated"));
        j["spec"]["manualSelector"] = json!(true);
        let mut causes = Vec::new();
        Job.validate(&j, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn the_template_changes_only_while_suspended() {
        let mut old = job(json!({"template": template()}));
        Job.defaults(&mut old);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("other");
        let mut causes = Vec::new();
        Job.validate_update(&old, &new, &mut causes);
        assert_eq!(causes[0].field, "spec.template");
        old["spec"]["suspend"] = json!(true);
        let mut causes = Vec::new();
        Job.validate_update(&old, &new, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
    }
}
