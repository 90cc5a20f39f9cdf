//! Cron schedules as Kubernetes' CronJobs read them (the standard five fields of Vixie cron, as
//! robfig/cron's standard parser takes them): minute, hour, day of month, month, day of week;
//! each a list of `*`, `n`, `n-m`, any of them with `/step`; month and weekday names
//! (`jan`, `mon`); `?` for `*`; and the descriptors `@yearly`, `@annually`, `@monthly`,
//! `@weekly`, `@daily`, `@midnight`, `@hourly`.
//!
//! Times are worked out in a time zone (the CronJob's `spec.timeZone`, read from the system's
//! tz database; UTC when unset), minute by minute of its wall clock.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A parsed schedule: the allowed values of each field as bit sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schedule {
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    weekdays: u64,
    /// The day of month or the day of week was `*` (or `?`): then a day must match both
    /// fields, else either (Vixie cron's rule).
    day_star: bool,
}

const MONTHS: &[&str] = &[
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const WEEKDAYS: &[&str] = &["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

struct Field {
    what: &'static str,
    min: u32,
    max: u32,
    /// Names of the values from `min` on.
    names: &'static [&'static str],
}

const FIELDS: [Field; 5] = [
    Field {
        what: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        what: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        what: "day of month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        what: "month",
        min: 1,
        max: 12,
        names: MONTHS,
    },
    Field {
        what: "day of week",
        min: 0,
        max: 6,
        names: WEEKDAYS,
    },
];

impl Field {
    fn value(&self, s: &str) -> Result<u32, String> {
        if let Some(i) = self.names.iter().position(|n| n.eq_ignore_ascii_case(s)) {
            return Ok(self.min + i as u32);
        }
        let n: u32 = s
            .parse()
            .map_err(|_| format!("failed to parse int from {s}: invalid syntax"))?;
        if n < self.min || n > self.max {
            return Err(format!(
                "{} {n} out of range ({}-{})",
                self.what, self.min, self.max
            ));
        }
        Ok(n)
    }

    /// The bits one field allows, and whether it was a star.
    fn parse(&self, expr: &str) -> Result<(u64, bool), String> {
        let mut bits = 0u64;
        let mut star = false;
        for part in expr.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((r, s)) => {
                    let step: u32 = s
                        .parse()
                        .map_err(|_| format!("failed to parse int from {s}: invalid syntax"))?;
                    if step == 0 {
                        return Err(format!("step of range should be a positive number: {part}"));
                    }
                    (r, Some(step))
                }
                None => (part, None),
            };
            let (lo, hi) = if range == "*" || range == "?" {
                star = star || step.is_none();
                (self.min, self.max)
            } else if let Some((a, b)) = range.split_once('-') {
                (self.value(a)?, self.value(b)?)
            } else {
                let v = self.value(range)?;
                // `n/step` runs from n to the field's end.
                (v, if step.is_some() { self.max } else { v })
            };
            if lo > hi {
                return Err(format!(
                    "beginning of range ({lo}) beyond end of range ({hi}): {part}"
                ));
            }
            let step = step.unwrap_or(1);
            let mut v = lo;
            while v <= hi {
                bits |= 1 << v;
                v += step;
            }
        }
        Ok((bits, star))
    }
}

impl Schedule {
    /// Parses a schedule; the error is the sentence Kubernetes' validation shows after
    /// `spec.schedule: Invalid value: "...": `.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let spec = spec.trim();
        if spec.starts_with("TZ=") || spec.starts_with("CRON_TZ=") {
            return Err("cannot use TZ or CRON_TZ in schedule, use timeZone field instead".into());
        }
        let expanded = match spec {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            s if s.starts_with('@') => return Err(format!("unrecognized descriptor: {s}")),
            s => s,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(format!(
                "expected exactly 5 fields, found {}: {spec}",
                fields.len()
            ));
        }
        let mut parsed = [(0u64, false); 5];
        for (i, f) in FIELDS.iter().enumerate() {
            parsed[i] = f.parse(fields[i])?;
        }
        Ok(Schedule {
            minutes: parsed[0].0,
            hours: parsed[1].0,
            days: parsed[2].0,
            months: parsed[3].0,
            weekdays: parsed[4].0,
            day_star: parsed[2].1 || parsed[4].1,
        })
    }

    fn day_matches(&self, d: Date) -> bool {
        let dom = self.days & (1 << d.day()) != 0;
        let dow = self.weekdays & (1 << d.weekday().to_sunday_zero_offset()) != 0;
        if self.day_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// The first scheduled time strictly after `after`, in `tz`'s wall clock; None when there
    /// is none within five years (`30 2 30 2 *`).
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let local = after.to_zoned(tz.clone()).datetime();
        // The next whole minute.
        let mut t = local
            .with()
            .second(0)
            .subsec_nanosecond(0)
            .build()
            .ok()?
            .checked_add(1.minute())
            .ok()?;
        let limit = t.year() + 5;
        while t.year() <= limit {
            if self.months & (1 << t.month()) == 0 {
                let first = t.date().first_of_month().checked_add(1.month()).ok()?;
                t = first.to_datetime(jiff::civil::Time::midnight());
                continue;
            }
            if !self.day_matches(t.date()) {
                t = next_day(t)?;
                continue;
            }
            if self.hours & (1 << t.hour()) == 0 {
                t = t
                    .with()
                    .minute(0)
                    .build()
                    .ok()?
                    .checked_add(1.hour())
                    .ok()?;
                continue;
            }
            if self.minutes & (1 << t.minute()) == 0 {
                t = t.checked_add(1.minute()).ok()?;
                continue;
            }
            let at = tz.to_ambiguous_timestamp(t).compatible().ok()?;
            if at > after {
                return Some(at);
            }
            t = t.checked_add(1.minute()).ok()?;
        }
        None
    }
}

fn next_day(t: DateTime) -> Option<DateTime> {
    let d = t.date().tomorrow().ok()?;
    Some(d.to_datetime(jiff::civil::Time::midnight()))
}

/// The time zone a CronJob names (`spec.timeZone`), or UTC when it names none; the error is
/// Kubernetes' wording for a name the tz database does not know.
pub fn time_zone(name: Option<&str>) -> Result<TimeZone, String> {
    match name {
        None => Ok(TimeZone::UTC),
        Some("") => Err("timeZone must be nil or non-empty string".into()),
        Some(n) if n.eq_ignore_ascii_case("local") => Err(
            "timeZone must be an explicit time zone as defined in https://www.iana.org/time-zones"
                .into(),
        ),
        Some(n) => TimeZone::get(n).map_err(|_| format!("unknown time zone {n}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn next_times() {
        let utc = TimeZone::UTC;
        for (spec, after, want) in [
            ("* * * * *", "2026-01-01T00:00:30Z", "2026-01-01T00:01:00Z"),
            ("* * * * *", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"),
            (
                "*/15 * * * *",
                "2026-01-01T00:16:00Z",
                "2026-01-01T00:30:00Z",
            ),
            ("5 4 * * *", "2026-01-01T04:05:00Z", "2026-01-02T04:05:00Z"),
            (
                "0 22 * * 1-5",
                "2026-01-02T23:00:00Z",
                "2026-01-05T22:00:00Z",
            ),
            (
                "0 0 1 jan,jul *",
                "2026-02-01T00:00:00Z",
                "2026-07-01T00:00:00Z",
            ),
            ("@hourly", "2026-01-01T10:59:59Z", "2026-01-01T11:00:00Z"),
            ("@weekly", "2026-01-01T00:00:00Z", "2026-01-04T00:00:00Z"),
            ("@yearly", "2026-03-01T00:00:00Z", "2027-01-01T00:00:00Z"),
            ("0 0 29 2 *", "2026-03-01T00:00:00Z", "2028-02-29T00:00:00Z"),
            // Day of month or day of week when neither is a star: the 13th, or a Friday.
            (
                "0 0 13 * fri",
                "2026-01-01T00:00:00Z",
                "2026-01-02T00:00:00Z",
            ),
            (
                "0 0 13 * fri",
                "2026-01-10T00:00:00Z",
                "2026-01-13T00:00:00Z",
            ),
            (
                "10-20/5 3 * * ?",
                "2026-01-01T03:11:00Z",
                "2026-01-01T03:15:00Z",
            ),
            (
                "7/20 * * * *",
                "2026-01-01T00:28:00Z",
                "2026-01-01T00:47:00Z",
            ),
        ] {
            let s = Schedule::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(
                s.next_after(ts(after), &utc),
                Some(ts(want)),
                "{spec} after {after}"
            );
        }
    }

    #[test]
    fn a_time_zone_moves_the_schedule() {
        let Ok(tz) = time_zone(Some("Europe/Berlin")) else {
            // No tz database on this machine: nothing to compare with.
            return;
        };
        let s = Schedule::parse("0 9 * * *").unwrap();
        // Winter: UTC+1; summer: UTC+2.
        assert_eq!(
            s.next_after(ts("2026-01-10T00:00:00Z"), &tz),
            Some(ts("2026-01-10T08:00:00Z"))
        );
        assert_eq!(
            s.next_after(ts("2026-07-10T00:00:00Z"), &tz),
            Some(ts("2026-07-10T07:00:00Z"))
        );
        assert_eq!(
            time_zone(Some("Mars/Olympus")).unwrap_err(),
            "unknown time zone Mars/Olympus"
        );
        assert!(time_zone(Some("Local"))
            .unwrap_err()
            .contains("explicit time zone"));
        assert_eq!(
            time_zone(Some("")).unwrap_err(),
            "timeZone must be nil or non-empty string"
        );
    }

    #[test]
    fn bad_schedules_say_why() {
        for (spec, want) in [
            ("* * * *", "expected exactly 5 fields, found 4: * * * *"),
            ("61 * * * *", "minute 61 out of range (0-59)"),
            ("* * * * 8", "day of week 8 out of range (0-6)"),
            (
                "5-1 * * * *",
                "beginning of range (5) beyond end of range (1): 5-1",
            ),
            (
                "*/0 * * * *",
                "step of range should be a positive number: */0",
            ),
            ("@every 5m", "unrecognized descriptor: @every 5m"),
            (
                "TZ=UTC * * * * *",
                "cannot use TZ or CRON_TZ in schedule, use timeZone field instead",
            ),
            ("x * * * *", "failed to parse int from x: invalid syntax"),
        ] {
            assert_eq!(Schedule::parse(spec).unwrap_err(), want, "{spec}");
        }
        assert!(Schedule::parse("30 2 30 2 *")
            .unwrap()
            .next_after(ts("2026-01-01T00:00:00Z"), &TimeZone::UTC)
            .is_none());
    }
}
