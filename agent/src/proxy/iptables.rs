//! The node's tables as they are: the tool runner, the jumps from the built-in chains into
//! rkube's, and the chains an earlier run left.

use super::rules::{Chains, Rules};

/// The jumps from the built-in chains into rkube's, made once (checked first, so a restarted
/// agent adds none twice).
pub(super) const JUMPS: [(&str, &str, &str); 6] = [
    ("nat", "PREROUTING", "-j RKUBE-SERVICES"),
    ("nat", "OUTPUT", "-j RKUBE-SERVICES"),
    ("nat", "POSTROUTING", "-j RKUBE-POSTROUTING"),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW -j RKUBE-SERVICES",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW -j RKUBE-SERVICES",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW -j RKUBE-EXTERNAL-SERVICES",
    ),
];

/// Runs a tool (`ip`, `iptables`, `iptables-save`, `iptables-restore`) with `input` on its
/// standard input; its standard output, or an error with its standard error.
pub(super) fn run_tool(args: &[&str], input: Option<&str>) -> anyhow::Result<String> {
    use std::io::Write;
    let program = args[0];
    let mut child = std::process::Command::new(program)
        .args(&args[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("running {program}: {e}"))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        anyhow::bail!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// rkube's chains present in the node's tables (what an earlier run left), with contents
/// that match nothing rendered, so that the first sync rewrites or deletes every one.
pub(super) fn existing_rules() -> Rules {
    let chains = |table: &str| -> Chains {
        run_tool(&["iptables-save", "-t", table], None)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|c| c.starts_with("RKUBE-"))
            .map(|c| (c.to_string(), vec!["(left by an earlier run)".to_string()]))
            .collect()
    };
    Rules {
        nat: chains("nat"),
        filter: chains("filter"),
    }
}
