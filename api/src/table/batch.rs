//! The rows of Jobs and CronJobs, as kubectl's printers write them (`printJob`, `printCronJob`).

use chrono::{DateTime, Utc};
use rkube_core::json::int_at as i;
use rkube_core::json::str_at as s;
use serde_json::{json, Value};

use super::format::{age, arr, containers_images, human_duration, selector_string};

/// The columns of a batch kind, or None for another kind.
pub(super) fn batch_columns(kind: &str) -> Option<super::columns::Columns> {
    Some(match kind {
        "Job" => &[
            ("Name", "string", 0),
            ("Status", "string", 0),
            ("Completions", "string", 0),
            ("Duration", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        "CronJob" => &[
            ("Name", "string", 0),
            ("Schedule", "string", 0),
            ("Timezone", "string", 0),
            ("Suspend", "boolean", 0),
            ("Active", "integer", 0),
            ("Last Schedule", "string", 0),
            ("Age", "string", 0),
            ("Containers", "string", 1),
            ("Images", "string", 1),
            ("Selector", "string", 1),
        ],
        _ => return None,
    })
}

fn has_condition(o: &Value, ty: &str) -> bool {
    arr(o, "/status/conditions")
        .iter()
        .any(|c| s(c, "/type") == ty && s(c, "/status") == "True")
}

fn time(o: &Value, ptr: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(o.pointer(ptr)?.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

/// A job's Status column: what it came to, else what it is doing.
fn job_status(o: &Value) -> &'static str {
    if has_condition(o, "Complete") {
        "Complete"
    } else if has_condition(o, "Failed") {
        "Failed"
    } else if o.pointer("/metadata/deletionTimestamp").is_some() {
        "Terminating"
    } else if has_condition(o, "Suspended") {
        "Suspended"
    } else if has_condition(o, "FailureTarget") {
        "FailureTarget"
    } else if has_condition(o, "SuccessCriteriaMet") {
        "SuccessCriteriaMet"
    } else {
        "Running"
    }
}

/// The cells after the name (Age left null for the caller), or None for another kind.
pub(super) fn batch_row(kind: &str, o: &Value, now: DateTime<Utc>) -> Option<Vec<Value>> {
    Some(match kind {
        "Job" => {
            let succeeded = i(o, "/status/succeeded");
            let completions = match o.pointer("/spec/completions").and_then(Value::as_i64) {
                Some(c) => format!("{succeeded}/{c}"),
                None => match i(o, "/spec/parallelism") {
                    p if p > 1 => format!("{succeeded}/1 of {p}"),
                    _ => format!("{succeeded}/1"),
                },
            };
            let duration = match (
                time(o, "/status/startTime"),
                time(o, "/status/completionTime"),
            ) {
                (None, _) => String::new(),
                (Some(start), None) => human_duration((now - start).num_seconds()),
                (Some(start), Some(end)) => human_duration((end - start).num_seconds()),
            };
            let (c, im) = containers_images(o, "/spec/template/spec/containers");
            vec![
                json!(job_status(o)),
                json!(completions),
                json!(duration),
                Value::Null,
                json!(c),
                json!(im),
                json!(selector_string(o.pointer("/spec/selector"))),
            ]
        }
        "CronJob" => {
            let last = match o.pointer("/status/lastScheduleTime") {
                Some(t) => age(Some(t), now),
                None => "<none>".into(),
            };
            let tz = match o.pointer("/spec/timeZone").and_then(Value::as_str) {
                Some(z) => z.to_string(),
                None => "<none>".into(),
            };
            let suspend = match o.pointer("/spec/suspend").and_then(Value::as_bool) {
                Some(true) => "True",
                Some(false) => "False",
                None => "<unset>",
            };
            let (c, im) = containers_images(o, "/spec/jobTemplate/spec/template/spec/containers");
            vec![
                json!(s(o, "/spec/schedule")),
                json!(tz),
                json!(suspend),
                json!(arr(o, "/status/active").len()),
                json!(last),
                Value::Null,
                json!(c),
                json!(im),
                json!(selector_string(
                    o.pointer("/spec/jobTemplate/spec/selector")
                )),
            ]
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_and_cronjob_rows() {
        let now: DateTime<Utc> = "2026-01-01T00:10:00Z".parse().unwrap();
        let job = json!({"spec": {"completions": 3, "parallelism": 2,
            "template": {"spec": {"containers": [{"name": "pi", "image": "perl"}]}}},
            "status": {"succeeded": 3, "startTime": "2026-01-01T00:00:00Z",
                "completionTime": "2026-01-01T00:00:42Z",
                "conditions": [{"type": "SuccessCriteriaMet", "status": "True"},
                               {"type": "Complete", "status": "True"}]}});
        let row = batch_row("Job", &job, now).unwrap();
        assert_eq!(row[..3], [json!("Complete"), json!("3/3"), json!("42s")]);
        let running = json!({"spec": {"parallelism": 4}, "status": {"succeeded": 1,
            "startTime": "2026-01-01T00:09:00Z"}});
        let row = batch_row("Job", &running, now).unwrap();
        assert_eq!(
            row[..3],
            [json!("Running"), json!("1/1 of 4"), json!("60s")]
        );
        let cj = json!({"spec": {"schedule": "*/1 * * * *", "suspend": false,
            "jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}}},
            "status": {"active": [{"name": "a"}], "lastScheduleTime": "2026-01-01T00:09:00Z"}});
        let row = batch_row("CronJob", &cj, now).unwrap();
        assert_eq!(
            row[..5],
            [
                json!("*/1 * * * *"),
                json!("<none>"),
                json!("False"),
                json!(1),
                json!("60s")
            ]
        );
    }
}
