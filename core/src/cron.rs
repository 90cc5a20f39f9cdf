//! Cron schedules as Kubernetes' CronJobs read them (the standard five fields of Vixie cron, as
//! robfig/cron's standard parser takes them): minute, hour, day of month, month, day of week;
//! each a list of `*`, `n`, `n-m`, any of them with `/step`; month and weekday names
//! (`jan`, `mon`); `?` for `*`; and the descriptors `@yearly`, `@annually`, `@monthly`,
//! `@weekly`, `@daily`, `@midnight`, `@hourly`.
//!
//! Times are worked out in a time zone (the CronJob's `spec.timeZone`, read from the system's
//! tz database; UTC when unset) as robfig/cron works them out, daylight-saving changes
//! included ([`Schedule::next_after`]).

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

/// A parsed schedule: the allowed values of each field as bit sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The zone a `TZ=` or `CRON_TZ=` prefix names (which Kubernetes 1.32 refuses in new
    /// CronJobs, [`TZ_IN_SCHEDULE`], but still follows in stored ones).
    zone: Option<TimeZone>,
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

/// Kubernetes' validation message for a schedule that names a zone itself (anywhere in it).
pub const TZ_IN_SCHEDULE: &str = "cannot use TZ or CRON_TZ in schedule, use timeZone field instead";

/// Whether a schedule names a zone itself, as Kubernetes tells (it contains `TZ`).
pub fn names_zone(schedule: &str) -> bool {
    schedule.contains("TZ")
}

impl Schedule {
    /// Parses a schedule, with robfig/cron's `TZ=<zone>` or `CRON_TZ=<zone>` prefix; the
    /// error is the sentence Kubernetes' validation shows after `spec.schedule: Invalid
    /// value: "...": `.
    pub fn parse(spec: &str) -> Result<Schedule, String> {
        let mut spec = spec.trim();
        let mut zone = None;
        if let Some(rest) = spec
            .strip_prefix("TZ=")
            .or_else(|| spec.strip_prefix("CRON_TZ="))
        {
            let (name, fields) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
            zone =
                Some(zone_named(name).map_err(|e| format!("provided bad location {name}: {e}"))?);
            spec = fields.trim();
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
            zone,
            minutes: parsed[0].0,
            hours: parsed[1].0,
            days: parsed[2].0,
            months: parsed[3].0,
            weekdays: parsed[4].0,
            day_star: parsed[2].1 || parsed[4].1,
        })
    }

    /// The zone the schedule itself names, which wins over the CronJob's timeZone.
    pub fn zone(&self) -> Option<&TimeZone> {
        self.zone.as_ref()
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
    ///
    /// As robfig/cron (the library Kubernetes' CronJob controller uses) finds it: the fields
    /// are matched on the wall clock while hours and minutes advance in absolute time, so a
    /// time that a daylight-saving change skips (02:30 on the morning clocks go forward) does
    /// not run that day, and a time that happens twice (01:30 on the morning they go back)
    /// runs twice, an hour apart.
    pub fn next_after(&self, after: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        let at = |d: DateTime| tz.to_ambiguous_timestamp(d).compatible().ok();
        let civil = |t: Timestamp| t.to_zoned(tz.clone()).datetime();
        // The upcoming whole second.
        let mut t = Timestamp::from_second(after.as_second().checked_add(1)?).ok()?;
        let mut added = false;
        let year_limit = civil(t).year() + 5;
        'wrap: loop {
            let mut c = civil(t);
            if c.year() > year_limit {
                return None;
            }
            while self.months & (1 << c.month()) == 0 {
                if !added {
                    added = true;
                    t = at(c.date().first_of_month().to_datetime(Time::midnight()))?;
                }
                t = at(add_date(civil(t), 1, 0)?)?;
                c = civil(t);
                if c.month() == 1 {
                    continue 'wrap;
                }
            }
            while !self.day_matches(c.date()) {
                if !added {
                    added = true;
                    t = at(c.date().to_datetime(Time::midnight()))?;
                }
                t = at(add_date(civil(t), 0, 1)?)?;
                c = civil(t);
                // Midnight may not exist on the day clocks change: back to the day's start.
                if c.hour() != 0 {
                    let hours = if c.hour() > 12 {
                        24 - i64::from(c.hour())
                    } else {
                        -i64::from(c.hour())
                    };
                    t = t.checked_add(hours.hours()).ok()?;
                    c = civil(t);
                }
                if c.day() == 1 {
                    continue 'wrap;
                }
            }
            while self.hours & (1 << c.hour()) == 0 {
                if !added {
                    added = true;
                    t = at(c
                        .with()
                        .minute(0)
                        .second(0)
                        .subsec_nanosecond(0)
                        .build()
                        .ok()?)?;
                }
                t = t.checked_add(1.hour()).ok()?;
                c = civil(t);
                if c.hour() == 0 {
                    continue 'wrap;
                }
            }
            while self.minutes & (1 << c.minute()) == 0 {
                if !added {
                    added = true;
                    t = Timestamp::from_second(t.as_second().div_euclid(60) * 60).ok()?;
                }
                t = t.checked_add(1.minute()).ok()?;
                c = civil(t);
                if c.minute() == 0 {
                    continue 'wrap;
                }
            }
            // Standard schedules run at second 0.
            while c.second() != 0 {
                if !added {
                    added = true;
                    t = Timestamp::from_second(t.as_second()).ok()?;
                }
                t = t.checked_add(1.second()).ok()?;
                c = civil(t);
                if c.second() == 0 {
                    continue 'wrap;
                }
            }
            return Some(t);
        }
    }
}

/// `t` moved by whole months and days as Go's `AddDate` moves it: a day past the month's end
/// carries into the next month (January 31 and a month is March 3 or 2).
fn add_date(t: DateTime, months: i32, days: i64) -> Option<DateTime> {
    let month0 = i32::from(t.month()) - 1 + months;
    let year = i32::from(t.year()) + month0.div_euclid(12);
    let month = (month0.rem_euclid(12) + 1) as i8;
    let first = Date::new(i16::try_from(year).ok()?, month, 1).ok()?;
    let date = first
        .checked_add((i64::from(t.day()) - 1 + days).days())
        .ok()?;
    Some(date.to_datetime(t.time()))
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
        Some(n) => zone_named(n),
    }
}

/// A zone of the tz database by its exact name, as Go's `time.LoadLocation` finds one (the
/// database's files, whose names are case-sensitive); Kubernetes' validation first refuses
/// names with parts that no zone has.
fn zone_named(name: &str) -> Result<TimeZone, String> {
    let unknown = || format!("unknown time zone {name}");
    let bad_part = |p: &str| {
        p == "."
            || p == ".."
            || p.starts_with('-')
            || p.is_empty()
            || p.len() > 14
            || !p
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '+'))
    };
    if name != "UTC" && name.split('/').any(bad_part) {
        return Err(unknown());
    }
    let tz = TimeZone::get(name).map_err(|_| unknown())?;
    // The database is looked up without regard to case; Go's is not.
    match tz.iana_name() {
        Some(found) if found != name && name != "UTC" => Err(unknown()),
        _ => Ok(tz),
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
        for name in [
            "europe/berlin",
            "Europe/../Berlin",
            "-Europe/Berlin",
            "Europe/Berlin ",
        ] {
            assert_eq!(
                time_zone(Some(name)).unwrap_err(),
                format!("unknown time zone {name}"),
                "{name}"
            );
        }
        assert!(time_zone(Some("UTC")).is_ok());
        // A zone the schedule names itself wins.
        let s = Schedule::parse("TZ=Europe/Berlin 0 9 * * *").unwrap();
        assert!(s.zone().is_some() && names_zone("TZ=Europe/Berlin 0 9 * * *"));
        assert_eq!(
            s.next_after(ts("2026-01-10T00:00:00Z"), s.zone().unwrap()),
            Some(ts("2026-01-10T08:00:00Z"))
        );
        assert!(Schedule::parse("0 9 * * *").unwrap().zone().is_none());
    }

    /// robfig/cron's daylight-saving cases (America/New_York: clocks go forward at 02:00 on
    /// 2012-03-11 and back at 02:00 on 2012-11-04), which Kubernetes' CronJobs follow.
    #[test]
    fn daylight_saving_changes_skip_and_repeat_times() {
        let Ok(ny) = time_zone(Some("America/New_York")) else {
            // No tz database on this machine: nothing to compare with.
            return;
        };
        for (after, spec, want) in [
            // 02:30 does not exist on the 11th of March 2012: next year's.
            (
                "2012-03-11T00:00:00-05:00",
                "30 2 11 Mar ?",
                Some("2013-03-11T02:30:00-04:00"),
            ),
            // Hourly: 01:00 EST, then 03:00 EDT.
            (
                "2012-03-11T00:00:00-05:00",
                "0 * * * *",
                Some("2012-03-11T01:00:00-05:00"),
            ),
            (
                "2012-03-11T01:00:00-05:00",
                "0 * * * *",
                Some("2012-03-11T03:00:00-04:00"),
            ),
            (
                "2012-03-11T03:00:00-04:00",
                "0 * * * *",
                Some("2012-03-11T04:00:00-04:00"),
            ),
            // Nightly at 02:00: skipped on the day it does not exist.
            (
                "2012-03-11T00:00:00-05:00",
                "0 2 * * *",
                Some("2012-03-12T02:00:00-04:00"),
            ),
            (
                "2012-03-11T01:00:00-05:00",
                "0 1 * * *",
                Some("2012-03-12T01:00:00-04:00"),
            ),
            // 02:30 on the 4th of November happens once, in EST.
            (
                "2012-11-04T00:00:00-04:00",
                "30 2 04 Nov ?",
                Some("2012-11-04T02:30:00-05:00"),
            ),
            // 01:30 happens twice: after the first (EDT), the second (EST).
            (
                "2012-11-04T01:45:00-04:00",
                "30 1 04 Nov ?",
                Some("2012-11-04T01:30:00-05:00"),
            ),
            // Hourly: 01:00 EDT, 01:00 EST, 02:00 EST.
            (
                "2012-11-04T00:00:00-04:00",
                "0 * * * *",
                Some("2012-11-04T01:00:00-04:00"),
            ),
            (
                "2012-11-04T01:00:00-04:00",
                "0 * * * *",
                Some("2012-11-04T01:00:00-05:00"),
            ),
            (
                "2012-11-04T01:00:00-05:00",
                "0 * * * *",
                Some("2012-11-04T02:00:00-05:00"),
            ),
            // Nightly at 01:00 runs twice that night, then the next.
            (
                "2012-11-04T01:00:00-04:00",
                "0 1 * * *",
                Some("2012-11-04T01:00:00-05:00"),
            ),
            (
                "2012-11-04T01:00:00-05:00",
                "0 1 * * *",
                Some("2012-11-05T01:00:00-05:00"),
            ),
            (
                "2012-11-04T00:00:00-04:00",
                "0 2 * * *",
                Some("2012-11-04T02:00:00-05:00"),
            ),
            (
                "2012-11-04T00:00:00-04:00",
                "0 3 * * *",
                Some("2012-11-04T03:00:00-05:00"),
            ),
            ("2012-07-09T23:35:00-04:00", "0 0 30 Feb ?", None),
        ] {
            let s = Schedule::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
            assert_eq!(
                s.next_after(ts(after), &ny),
                want.map(ts),
                "{spec} after {after}"
            );
        }
        // São Paulo skipped midnight on the 4th of November 2018 (00:00 became 01:00): the
        // nightly run at midnight skips that day, and an hourly one goes on at 01:00.
        let Ok(sp) = time_zone(Some("America/Sao_Paulo")) else {
            return;
        };
        for (after, spec, want) in [
            (
                "2018-11-03T12:00:00-03:00",
                "0 0 * * *",
                "2018-11-05T00:00:00-02:00",
            ),
            (
                "2018-11-03T23:00:00-03:00",
                "0 * * * *",
                "2018-11-04T01:00:00-02:00",
            ),
            (
                "2018-11-03T12:00:00-03:00",
                "30 0 4 11 *",
                "2019-11-04T00:30:00-03:00",
            ),
        ] {
            let s = Schedule::parse(spec).unwrap();
            assert_eq!(
                s.next_after(ts(after), &sp),
                Some(ts(want)),
                "{spec} after {after}"
            );
        }
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
                "CRON_TZ=Mars/Olympus * * * * *",
                "provided bad location Mars/Olympus: unknown time zone Mars/Olympus",
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
