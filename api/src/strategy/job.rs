//! Jobs (batch/v1): Kubernetes' defaults (one completion and one pod at a time, six retries,
//! NonIndexed, not suspended), the selector the server generates from the job's uid with the
//! labels it puts on the pod template, and the rules of `pkg/apis/batch/validation`.

use serde_json::{json, Map, Value};

use crate::admission::{
    child, default, default_template, validate_label_selector, validate_template,
};
use crate::error::Cause;

use super::field::{domain_prefixed_path, invalid, not_supported, required, too_long};
use super::{immutable, immutable_even_unset, Strategy};

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
        immutable_even_unset("/spec/managedBy", current, new, causes);
        immutable_even_unset("/spec/successPolicy", current, new, causes);
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
    if let Some(v) = spec.and_then(|s| s.get("managedBy")) {
        validate_managed_by(&format!("{at}.managedBy"), v, causes);
    }
    if let Some(v) = spec.and_then(|s| s.get("successPolicy")) {
        let field = format!("{at}.successPolicy");
        if indexed {
            let completions = spec
                .and_then(|s| s.get("completions"))
                .and_then(Value::as_i64);
            validate_success_policy(&field, v, completions, causes);
        } else {
            causes.push(invalid(&field, v, "requires indexed completion mode"));
        }
    }
    let has_failure_policy = spec.and_then(|s| s.get("podFailurePolicy")).is_some();
    if let Some(v) = spec.and_then(|s| s.get("podReplacementPolicy")) {
        let field = format!("{at}.podReplacementPolicy");
        let allowed: &[&str] = if has_failure_policy {
            &["Failed"]
        } else {
            &["Failed", "TerminatingOrFailed"]
        };
        if !allowed.contains(&v.as_str().unwrap_or("")) {
            causes.push(not_supported(&field, v, allowed));
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

/// The controller that reconciles the job instead of Kubernetes' own: a domain-prefixed path
/// of at most 63 bytes.
fn validate_managed_by(field: &str, value: &Value, causes: &mut Vec<Cause>) {
    let s = value.as_str().unwrap_or("");
    if s.is_empty() {
        causes.push(required(field, ""));
        return;
    }
    domain_prefixed_path(field, s, causes);
    if s.len() > MAX_MANAGED_BY {
        causes.push(too_long(field, MAX_MANAGED_BY));
    }
}

const MAX_MANAGED_BY: usize = 63;
const MAX_SUCCESS_RULES: usize = 20;
const MAX_SUCCEEDED_INDEXES: usize = 64 * 1024;

/// An Indexed job's successPolicy: 1 to 20 rules, each with succeededIndexes (valid indexes
/// below completions, in increasing order) or succeededCount (no more than the indexes it
/// can count) or both.
fn validate_success_policy(
    at: &str,
    policy: &Value,
    completions: Option<i64>,
    causes: &mut Vec<Cause>,
) {
    let rules_at = format!("{at}.rules");
    let rules = policy
        .get("rules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if rules.is_empty() {
        causes.push(required(
            &rules_at,
            "at least one rules must be specified when the successPolicy is specified",
        ));
    }
    if rules.len() > MAX_SUCCESS_RULES {
        causes.push(Cause {
            reason: "FieldValueTooMany",
            field: rules_at.clone(),
            message: format!(
                "Too many: {}: must have at most {MAX_SUCCESS_RULES} items",
                rules.len()
            ),
        });
    }
    let completions = completions.unwrap_or(0);
    for (i, rule) in rules.iter().enumerate() {
        let r = format!("{rules_at}[{i}]");
        let indexes = rule.get("succeededIndexes").filter(|v| !v.is_null());
        let count = rule.get("succeededCount").filter(|v| !v.is_null());
        if indexes.is_none() && count.is_none() {
            causes.push(required(
                &r,
                "at least one of succeededCount or succeededIndexes must be specified",
            ));
        }
        let mut total = 0;
        if let Some(v) = indexes {
            let field = format!("{r}.succeededIndexes");
            let s = v.as_str().unwrap_or("");
            if s.len() > MAX_SUCCEEDED_INDEXES {
                causes.push(too_long(&field, MAX_SUCCEEDED_INDEXES));
            }
            match indexes_total(s, completions) {
                Ok(n) => total = n,
                Err(e) => causes.push(invalid(
                    &field,
                    v,
                    &format!("error parsing succeededIndexes: {e}"),
                )),
            }
        }
        if let Some(v) = count {
            let field = format!("{r}.succeededCount");
            let n = v.as_i64().unwrap_or(-1);
            if n < 0 {
                causes.push(invalid(&field, v, "must be greater than or equal to 0"));
            }
            if n > completions {
                causes.push(invalid(
                    &field,
                    v,
                    &format!(
                        "must be less than or equal to {completions} (the number of specified completions)"
                    ),
                ));
            }
            if indexes.is_some() && n > total {
                causes.push(invalid(
                    &field,
                    v,
                    &format!(
                        "must be less than or equal to {total} (the number of indexes in the specified succeededIndexes field)"
                    ),
                ));
            }
        }
    }
}

/// How many indexes `1,3-5,7` names, if each is below `completions` and they increase.
fn indexes_total(s: &str, completions: i64) -> Result<i64, String> {
    if s.is_empty() {
        return Ok(0);
    }
    let mut last: Option<i64> = None;
    let mut total = 0;
    for interval in s.split(',') {
        let limits: Vec<&str> = interval.split('-').collect();
        if limits.len() > 2 {
            return Err(format!("the fragment {interval:?} violates the requirement that an index interval can have at most two parts separated by '-'"));
        }
        let index = |part: &str| -> Result<i64, String> {
            let i: i64 = part
                .parse()
                .map_err(|_| format!("cannot convert string to integer for index: {part:?}"))?;
            if i >= completions {
                return Err(format!("too large index: {part:?}"));
            }
            Ok(i)
        };
        let x = index(limits[0])?;
        let y = match limits.get(1) {
            Some(part) => {
                let y = index(part)?;
                if x >= y {
                    return Err(format!("non-increasing order, previous: {x}, current: {y}"));
                }
                y
            }
            None => x,
        };
        if let Some(prev) = last.filter(|p| *p >= x) {
            return Err(format!(
                "non-increasing order, previous: {prev}, current: {x}"
            ));
        }
        total += y - x + 1;
        last = Some(y);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(spec: Value) -> Value {
        json!({"metadata": {"name": "pi", "uid": "u-1"}, "spec": spec})
    }

    fn defaulted(spec: Value) -> Value {
        let mut j = job(spec);
        Job.defaults(&mut j);
        j
    }

    fn validated(j: &Value) -> Vec<Cause> {
        let mut causes = Vec::new();
        Job.validate(j, &mut causes);
        causes
    }

    /// Validation refuses `j` with `message` at `field` (among other causes maybe).
    fn assert_refused(j: &Value, field: &str, message: &str) {
        let causes = validated(j);
        assert!(
            causes
                .iter()
                .any(|c| c.field == field && c.message == message),
            "{field}: {causes:?}"
        );
    }

    fn updated(old: &Value, new: &Value) -> Vec<Cause> {
        let mut causes = Vec::new();
        Job.validate_update(old, new, &mut causes);
        causes
    }

    fn template() -> Value {
        json!({"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}})
    }

    #[test]
    fn defaults_generate_the_selector_and_labels() {
        let j = defaulted(json!({"template": template()}));
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
        let causes = validated(&j);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn parallelism_alone_leaves_completions_unset_and_per_index_limits_lift_the_backoff() {
        let j = defaulted(json!({"parallelism": 3, "template": template()}));
        assert!(j["spec"].get("completions").is_none());
        let j = defaulted(json!({"completions": 3, "completionMode": "Indexed",
            "backoffLimitPerIndex": 1, "template": template()}));
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
            let mut j = defaulted(spec);
            if field == "spec.template.spec.restartPolicy" {
                // The pod defaults would say Always.
                j["spec"]["template"]["spec"]["restartPolicy"] = json!("Always");
            }
            assert_refused(&j, field, message);
        }
    }

    #[test]
    fn success_policy_managed_by_and_replacement_policy_are_validated() {
        let indexed = |extra: Value| {
            let mut spec = json!({"completions": 5, "completionMode": "Indexed",
                "template": template()});
            for (k, v) in extra.as_object().unwrap() {
                spec[k] = v.clone();
            }
            spec
        };
        for (spec, field, message) in [
            (
                json!({"successPolicy": {"rules": [{"succeededCount": 1}]},
                    "template": template()}),
                "spec.successPolicy",
                "Invalid value: {\"rules\":[{\"succeededCount\":1}]}: requires indexed completion mode",
            ),
            (
                indexed(json!({"successPolicy": {"rules": []}})),
                "spec.successPolicy.rules",
                "Required value: at least one rules must be specified when the successPolicy is specified",
            ),
            (
                indexed(json!({"successPolicy": {"rules": [{}]}})),
                "spec.successPolicy.rules[0]",
                "Required value: at least one of succeededCount or succeededIndexes must be specified",
            ),
            (
                indexed(json!({"successPolicy": {"rules": [{"succeededIndexes": "0-5"}]}})),
                "spec.successPolicy.rules[0].succeededIndexes",
                "Invalid value: \"0-5\": error parsing succeededIndexes: too large index: \"5\"",
            ),
            (
                indexed(json!({"successPolicy": {"rules": [{"succeededIndexes": "3,1"}]}})),
                "spec.successPolicy.rules[0].succeededIndexes",
                "Invalid value: \"3,1\": error parsing succeededIndexes: non-increasing order, previous: 3, current: 1",
            ),
            (
                indexed(json!({"successPolicy": {"rules": [{"succeededCount": 6}]}})),
                "spec.successPolicy.rules[0].succeededCount",
                "Invalid value: 6: must be less than or equal to 5 (the number of specified completions)",
            ),
            (
                indexed(json!({"successPolicy": {"rules": [
                    {"succeededIndexes": "0-1", "succeededCount": 3}]}})),
                "spec.successPolicy.rules[0].succeededCount",
                "Invalid value: 3: must be less than or equal to 2 (the number of indexes in the specified succeededIndexes field)",
            ),
            (
                json!({"managedBy": "no-domain", "template": template()}),
                "spec.managedBy",
                "Invalid value: \"no-domain\": must be a domain-prefixed path (such as \"acme.io/foo\")",
            ),
            (
                json!({"podReplacementPolicy": "Sometimes", "template": template()}),
                "spec.podReplacementPolicy",
                "Unsupported value: \"Sometimes\": supported values: \"Failed\", \"TerminatingOrFailed\"",
            ),
            (
                json!({"podReplacementPolicy": "TerminatingOrFailed", "template": template(),
                    "podFailurePolicy": {"rules": [{"action": "Ignore",
                        "onExitCodes": {"operator": "In", "values": [2]}}]}}),
                "spec.podReplacementPolicy",
                "Unsupported value: \"TerminatingOrFailed\": supported values: \"Failed\"",
            ),
        ] {
            assert_refused(&defaulted(spec), field, message);
        }
        let ok = defaulted(indexed(json!({"managedBy": "example.com/queue",
            "successPolicy": {"rules": [{"succeededIndexes": "0,2-4", "succeededCount": 2}]}})));
        let causes = validated(&ok);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn managed_by_and_success_policy_never_change() {
        let old = defaulted(json!({"template": template()}));
        let mut new = old.clone();
        new["spec"]["managedBy"] = json!("example.com/queue");
        let causes = updated(&old, &new);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.managedBy");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"example.com/queue\": field is immutable"
        );
        let causes = updated(&new, &old);
        assert_eq!(causes[0].message, "Invalid value: null: field is immutable");
        let mut policy = old.clone();
        policy["spec"]["successPolicy"] = json!({"rules": [{"succeededCount": 1}]});
        let causes = updated(&old, &policy);
        assert_eq!(causes[0].field, "spec.successPolicy");
    }

    #[test]
    fn a_selector_of_ones_own_needs_manual_selector() {
        let sel = json!({"matchLabels": {"app": "x"}});
        let mut t = template();
        t["metadata"] = json!({"labels": {"app": "x"}});
        let mut j = defaulted(json!({"selector": sel, "template": t}));
        let causes = validated(&j);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert!(causes[0].message.ends_with("`selector` not auto-generated"));
        j["spec"]["manualSelector"] = json!(true);
        let causes = validated(&j);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn the_template_changes_only_while_suspended() {
        let mut old = defaulted(json!({"template": template()}));
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("other");
        let causes = updated(&old, &new);
        assert_eq!(causes[0].field, "spec.template");
        old["spec"]["suspend"] = json!(true);
        let causes = updated(&old, &new);
        assert!(causes.is_empty(), "{causes:?}");
    }
}
