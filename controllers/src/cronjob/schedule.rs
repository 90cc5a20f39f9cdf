//! Which scheduled time a CronJob owes a job for, and the job's name for it.

use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::Timestamp;
use rkube_core::cron::Schedule;

/// More missed times than this, and the controller says so (Kubernetes' limit of 100).
pub const TOO_MANY_MISSED: usize = 100;

/// `<cronjob>-<scheduled time in minutes since the epoch>`: one name per scheduled time.
pub fn job_name(cronjob: &str, scheduled: Timestamp) -> String {
    format!("{cronjob}-{}", scheduled.as_second().div_euclid(60))
}

/// The most recent scheduled time in (`earliest`, `now`], and how many times that interval
/// holds (counted up to one more than [`TOO_MANY_MISSED`]).
pub fn most_recent(
    schedule: &Schedule,
    tz: &TimeZone,
    earliest: Timestamp,
    now: Timestamp,
) -> (Option<Timestamp>, usize) {
    let mut count = 0;
    let mut last = None;
    let mut t = earliest;
    while let Some(next) = schedule.next_after(t, tz).filter(|n| *n <= now) {
        count += 1;
        last = Some(next);
        t = next;
        if count > TOO_MANY_MISSED {
            break;
        }
    }
    if count <= TOO_MANY_MISSED {
        return (last, count);
    }
    // Many missed: find the latest by looking back from `now` in growing windows; the first
    // window that holds a time holds few of them.
    for minutes in [
        1i64,
        60,
        24 * 60,
        31 * 24 * 60,
        366 * 24 * 60,
        5 * 366 * 24 * 60,
    ] {
        let from = Timestamp::from_second(now.as_second() - minutes * 60).unwrap_or(earliest);
        let mut t = from.max(earliest);
        let mut found = None;
        while let Some(next) = schedule.next_after(t, tz).filter(|n| *n <= now) {
            found = Some(next);
            t = next;
        }
        if found.is_some() {
            return (found, count);
        }
    }
    (last, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn the_most_recent_unmet_time() {
        let every_minute = Schedule::parse("* * * * *").unwrap();
        let utc = TimeZone::UTC;
        for (earliest, now, want, count) in [
            ("2026-01-01T00:00:30Z", "2026-01-01T00:00:50Z", None, 0),
            (
                "2026-01-01T00:00:30Z",
                "2026-01-01T00:01:00Z",
                Some("2026-01-01T00:01:00Z"),
                1,
            ),
            (
                "2026-01-01T00:01:00Z",
                "2026-01-01T00:03:10Z",
                Some("2026-01-01T00:03:00Z"),
                2,
            ),
            // A day missed: more than 100, and still the latest.
            (
                "2026-01-01T00:00:00Z",
                "2026-01-02T00:00:30Z",
                Some("2026-01-02T00:00:00Z"),
                101,
            ),
        ] {
            let (got, n) = most_recent(&every_minute, &utc, ts(earliest), ts(now));
            assert_eq!(got, want.map(ts), "{earliest}..{now}");
            assert_eq!(n, count, "{earliest}..{now}");
        }
    }

    #[test]
    fn names_count_minutes() {
        assert_eq!(job_name("hello", ts("1970-01-01T01:00:00Z")), "hello-60");
    }
}
