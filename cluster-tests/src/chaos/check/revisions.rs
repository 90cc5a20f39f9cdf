//! Header revisions never go back for one observer.

use std::collections::BTreeMap;

use super::seconds;

// ---------------------------------------------------------------------------------------------
// Revisions and lost writes
// ---------------------------------------------------------------------------------------------

/// (client or member label, observation time ns, header revision)
///
/// Per label, the revisions in time order never decrease (observations at the same time keep
/// their recorded order). The error names the label, both times and both revisions of the
/// earliest regression, and how many there were.
pub fn revisions_monotonic(observations: &[(String, u64, i64)]) -> Result<(), String> {
    let mut by_label: BTreeMap<&str, Vec<(u64, i64)>> = BTreeMap::new();
    for (label, at, revision) in observations {
        by_label.entry(label).or_default().push((*at, *revision));
    }
    let mut regressions: Vec<(u64, String)> = Vec::new();
    for (label, mut seen) in by_label {
        seen.sort_by_key(|&(at, _)| at);
        for pair in seen.windows(2) {
            let ((t1, r1), (t2, r2)) = (pair[0], pair[1]);
            if r2 < r1 {
                regressions.push((
                    t2,
                    format!(
                        "{label} saw revision {r1} at {} and then revision {r2} at {}",
                        seconds(t1),
                        seconds(t2)
                    ),
                ));
            }
        }
    }
    regressions.sort_by_key(|(at, _)| *at);
    match regressions.len() {
        0 => Ok(()),
        1 => Err(regressions.swap_remove(0).1),
        n => Err(format!(
            "{} ({} regressions in all)",
            regressions.swap_remove(0).1,
            n
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // --- revisions and lost writes ------------------------------------------------------------

    fn obs(label: &str, at: u64, revision: i64) -> (String, u64, i64) {
        (label.to_string(), at, revision)
    }

    #[test]
    fn revisions_that_never_decrease() {
        let ok = vec![
            obs("client-0", 10, 5),
            obs("client-1", 5, 9),
            obs("client-0", 30, 7),
            obs("client-0", 20, 5),
            obs("client-1", 40, 9),
        ];
        assert_eq!(revisions_monotonic(&ok), Ok(()));
        assert_eq!(revisions_monotonic(&[]), Ok(()));
    }

    #[test]
    fn revision_regressions_are_named() {
        let bad = vec![
            obs("client-0", 10, 5),
            obs("member-2", 1_500_000_000, 12),
            obs("client-0", 20, 6),
            obs("member-2", 2_250_000_000, 11),
            obs("client-0", 3_000_000_000, 4),
        ];
        let e = revisions_monotonic(&bad).unwrap_err();
        assert!(
            e.starts_with("member-2 saw revision 12 at 1.500000000 s"),
            "{e}"
        );
        assert!(e.contains("then revision 11 at 2.250000000 s"), "{e}");
        assert!(e.contains("2 regressions"), "{e}");
        // A label's own regression, reported even when observations arrive out of order.
        let e = revisions_monotonic(&[obs("c", 20, 3), obs("c", 10, 4)]).unwrap_err();
        assert!(
            e.contains("revision 4 at 0.000000010 s and then revision 3"),
            "{e}"
        );
    }
}
