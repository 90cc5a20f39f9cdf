//! Parsers for flag values shared by `rkube server` and `rkube up`.

use std::time::Duration;

use rkube_store::server::snapshot_schedule::MIN_INTERVAL;

/// A duration such as `30m`, `1h30m`, `10s` or `500ms` (units ms, s, m, h, d); `0` is zero.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("{s:?} is not a duration; write it like 30m, 1h30m, 10s or 500ms");
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let unit_len = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || unit_len == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit = match &rest[digits..digits + unit_len] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            "d" => Duration::from_secs(86_400),
            _ => return Err(bad()),
        };
        let part = u32::try_from(n)
            .ok()
            .and_then(|n| unit.checked_mul(n))
            .ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[digits + unit_len..];
    }
    Ok(total)
}

/// `--snapshot-interval`: 0 (off) or at least a second.
pub fn parse_snapshot_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !d.is_zero() && d < MIN_INTERVAL {
        return Err(format!(
            "{s:?} is shorter than {}s; every snapshot is a full copy of the store, so take them at most once a second (0 turns them off)",
            MIN_INTERVAL.as_secs()
        ));
    }
    Ok(d)
}

/// `--snapshot-retain`: at least one.
pub fn parse_retain(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of snapshots to keep; give 1 or more"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok = [
            ("0", Duration::ZERO),
            ("10s", Duration::from_secs(10)),
            ("30m", Duration::from_secs(1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("2d", Duration::from_secs(172_800)),
            ("1500ms", Duration::from_millis(1500)),
            (" 5s ", Duration::from_secs(5)),
        ];
        for (s, want) in ok {
            assert_eq!(parse_duration(s), Ok(want), "{s}");
        }
        for s in ["", "10", "s", "1x", "1.5h", "-1s", "10 s", "99999999999h"] {
            assert!(parse_duration(s).is_err(), "{s:?} must be refused");
        }
    }

    #[test]
    fn snapshot_interval_is_off_or_at_least_a_second() {
        assert_eq!(parse_snapshot_interval("0"), Ok(Duration::ZERO));
        assert_eq!(parse_snapshot_interval("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_snapshot_interval("500ms").is_err());
    }

    #[test]
    fn retain_is_at_least_one() {
        assert_eq!(parse_retain("2"), Ok(2));
        for s in ["0", "-1", "two", ""] {
            assert!(parse_retain(s).is_err(), "{s:?} must be refused");
        }
    }
}
