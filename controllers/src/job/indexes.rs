//! An Indexed job's sets of indexes as its status writes them (`completedIndexes`,
//! `failedIndexes`): sorted, consecutive indexes written as ranges (`1,3-5,7`).

use std::collections::BTreeSet;

/// The indexes of `1,3-5,7`; what does not parse is left out.
pub fn parse_indexes(s: Option<&str>) -> BTreeSet<i32> {
    let mut out = BTreeSet::new();
    for part in s.unwrap_or("").split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
                    out.extend(a..=b);
                }
            }
            None => {
                if let Ok(i) = part.parse() {
                    out.insert(i);
                }
            }
        }
    }
    out
}

/// `1,3-5,7`: consecutive indexes as one range, as Kubernetes writes them.
pub fn format_indexes(set: &BTreeSet<i32>) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut run: Option<(i32, i32)> = None;
    let flush = |run: (i32, i32), parts: &mut Vec<String>| {
        parts.push(if run.0 == run.1 {
            run.0.to_string()
        } else {
            format!("{}-{}", run.0, run.1)
        });
    };
    for &i in set {
        run = match run {
            Some((a, b)) if b + 1 == i => Some((a, i)),
            Some(r) => {
                flush(r, &mut parts);
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some(r) = run {
        flush(r, &mut parts);
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_round_trip() {
        for (s, set) in [
            ("", vec![]),
            ("0", vec![0]),
            ("0-1", vec![0, 1]),
            ("1,3-5,7", vec![1, 3, 4, 5, 7]),
        ] {
            let set: BTreeSet<i32> = set.into_iter().collect();
            assert_eq!(parse_indexes(Some(s)), set, "{s}");
            assert_eq!(format_indexes(&set), s);
        }
    }
}
