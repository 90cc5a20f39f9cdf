//! Acknowledged writes missing at the end.

use std::collections::HashSet;

/// Acknowledged unique keys written and the keys found at the end: the acknowledged ones
/// missing, in acknowledgement order, each once.
pub fn lost_writes(acknowledged: &[String], found: &HashSet<String>) -> Vec<String> {
    let mut reported = HashSet::new();
    acknowledged
        .iter()
        .filter(|k| !found.contains(*k) && reported.insert(k.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_writes_are_the_missing_acknowledged_ones() {
        let acked: Vec<String> = ["ack/1", "ack/2", "ack/3", "ack/2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let found: HashSet<String> = ["ack/1", "ack/9"].iter().map(|s| s.to_string()).collect();
        assert_eq!(lost_writes(&acked, &found), vec!["ack/2", "ack/3"]);
        let all: HashSet<String> = acked.iter().cloned().collect();
        assert!(lost_writes(&acked, &all).is_empty());
    }
}
