//! CronJobs (batch/v1): Kubernetes' defaults (Allow, not suspended, three successful and one
//! failed job kept), a schedule and time zone that parse, a job template that is a valid job,
//! and a name short enough for the jobs named after it.

use serde_json::{json, Value};

use rkube_core::cron::{names_zone, time_zone, Schedule, TZ_IN_SCHEDULE};

use crate::admission::{child, default, validate_pod_spec};
use crate::error::Cause;

use super::field::{invalid, not_supported, required};
use super::job::{default_job_spec, validate_job_spec};
use super::Strategy;

pub struct CronJob;

/// A job's name is the CronJob's and 11 more characters (`-` and the minutes since the epoch).
const MAX_NAME: usize = 52;

impl Strategy for CronJob {
    fn check_name(&self, name: &str) -> Option<String> {
        if name.len() > MAX_NAME {
            return Some(format!("must be no more than {MAX_NAME} characters"));
        }
        crate::admission::check_subdomain(name)
    }

    fn defaults(&self, object: &mut Value) {
        let Some(o) = object.as_object_mut() else {
            return;
        };
        let spec = child(o, "spec");
        default(spec, "concurrencyPolicy", json!("Allow"));
        default(spec, "suspend", json!(false));
        default(spec, "successfulJobsHistoryLimit", json!(3));
        default(spec, "failedJobsHistoryLimit", json!(1));
        let template = child(child(spec, "jobTemplate"), "spec");
        let has_template = template.contains_key("template");
        default_job_spec(template);
        if !has_template {
            // Nothing to default the pod of; validation names what is missing.
            template.shift_remove("template");
        }
    }

    fn validate(&self, object: &Value, causes: &mut Vec<Cause>) {
        let spec = object.get("spec");
        match spec.and_then(|s| s.get("schedule")).and_then(Value::as_str) {
            None | Some("") => causes.push(required("spec.schedule", "")),
            Some(s) => {
                if let Err(e) = Schedule::parse(s) {
                    causes.push(invalid("spec.schedule", &json!(s), &e));
                }
                if names_zone(s) {
                    causes.push(invalid("spec.schedule", &json!(s), TZ_IN_SCHEDULE));
                }
            }
        }
        if let Some(tz) = spec.and_then(|s| s.get("timeZone")) {
            if let Err(e) = time_zone(Some(tz.as_str().unwrap_or(""))) {
                causes.push(invalid("spec.timeZone", tz, &e));
            }
        }
        let policy = spec
            .and_then(|s| s.get("concurrencyPolicy"))
            .cloned()
            .unwrap_or(json!(""));
        let policies = ["Allow", "Forbid", "Replace"];
        if !policies.contains(&policy.as_str().unwrap_or("")) {
            causes.push(not_supported("spec.concurrencyPolicy", &policy, &policies));
        }
        for key in [
            "startingDeadlineSeconds",
            "successfulJobsHistoryLimit",
            "failedJobsHistoryLimit",
        ] {
            if let Some(v) = spec.and_then(|s| s.get(key)) {
                if v.as_i64().is_none_or(|n| n < 0) {
                    causes.push(invalid(
                        &format!("spec.{key}"),
                        v,
                        "must be greater than or equal to 0",
                    ));
                }
            }
        }
        let job = spec.and_then(|s| s.pointer("/jobTemplate/spec"));
        validate_job_spec(job, "spec.jobTemplate.spec", causes);
        validate_pod_spec(
            job.and_then(|j| j.pointer("/template/spec")),
            "spec.jobTemplate.spec.template.spec",
            causes,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cronjob(schedule: &str) -> Value {
        json!({"metadata": {"name": "hello"}, "spec": {"schedule": schedule,
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
                "containers": [{"name": "c", "image": "busybox"}]}}}}}})
    }

    #[test]
    fn defaults_and_a_valid_schedule() {
        let mut c = cronjob("*/1 * * * *");
        CronJob.defaults(&mut c);
        assert_eq!(c["spec"]["concurrencyPolicy"], "Allow");
        assert_eq!(c["spec"]["successfulJobsHistoryLimit"], 3);
        assert_eq!(c["spec"]["failedJobsHistoryLimit"], 1);
        assert_eq!(c["spec"]["suspend"], false);
        assert_eq!(c["spec"]["jobTemplate"]["spec"]["backoffLimit"], 6);
        let mut causes = Vec::new();
        CronJob.validate(&c, &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
    }

    #[test]
    fn a_bad_schedule_or_time_zone_is_refused() {
        let mut c = cronjob("* * *");
        c["spec"]["timeZone"] = json!("Nowhere/Never");
        CronJob.defaults(&mut c);
        let mut causes = Vec::new();
        CronJob.validate(&c, &mut causes);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.schedule", "spec.timeZone"]);
        assert_eq!(
            causes[0].message,
            "Invalid value: \"* * *\": expected exactly 5 fields, found 3: * * *"
        );
        // A zone in the schedule: refused with the field's message, besides any parse error.
        for (schedule, want) in [
            (
                "TZ=UTC * * * * *",
                vec!["Invalid value: \"TZ=UTC * * * * *\": cannot use TZ or CRON_TZ in schedule, use timeZone field instead"],
            ),
            (
                "CRON_TZ=Nowhere/Never 0 * * * *",
                vec![
                    "Invalid value: \"CRON_TZ=Nowhere/Never 0 * * * *\": provided bad location Nowhere/Never: unknown time zone Nowhere/Never",
                    "Invalid value: \"CRON_TZ=Nowhere/Never 0 * * * *\": cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
                ],
            ),
        ] {
            let mut c = cronjob(schedule);
            CronJob.defaults(&mut c);
            let mut causes = Vec::new();
            CronJob.validate(&c, &mut causes);
            let got: Vec<&str> = causes.iter().map(|c| c.message.as_str()).collect();
            assert_eq!(got, want, "{schedule}");
        }
        let mut c = cronjob("0 * * * *");
        c["spec"]["timeZone"] = json!("america/new_york");
        let mut causes = Vec::new();
        CronJob.validate(&c, &mut causes);
        assert_eq!(
            causes[0].message,
            "Invalid value: \"america/new_york\": unknown time zone america/new_york"
        );
        assert!(CronJob.check_name(&"a".repeat(53)).is_some());
        assert!(CronJob.check_name(&"a".repeat(52)).is_none());
    }
}
