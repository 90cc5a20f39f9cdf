//! Starting a server of the local cluster, a process of its own with the flags its layout
//! records.

use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result};

use super::layout::{LocalCluster, LocalMember};
use super::process::pid_path;

/// Each of `members` members on this machine gets its share of the CPUs (at least one), so
/// that together they run about one thread per CPU: with a thread per CPU each, three members
/// on two CPUs wake each other's threads for every request (check perf's CPU per write fell
/// 10% with one thread each; BENCHMARKS.md).
pub(crate) fn worker_share(members: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / members.max(1)).max(1)
}

/// Starts member `m` of the local cluster with its recorded flags and `extra` ones.
pub(crate) fn spawn_member(
    dir: &Path,
    cluster: &LocalCluster,
    m: &LocalMember,
    extra: &[&str],
) -> Result<i32> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find the rkube executable")?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{}.log", m.name)))?;
    let abs = std::fs::canonicalize(dir)?;
    let mut command = std::process::Command::new(exe);
    command
        .arg("server")
        .args(["--name", &m.name])
        .arg("--data-dir")
        .arg(abs.join(&m.name))
        .args([
            "--listen-peer",
            &m.peer,
            "--listen-client",
            &m.client,
            "--listen-metrics",
            &m.metrics,
        ]);
    if let Some(e) = &cluster.endpoint {
        command.args(["--vip-client", &e.client]);
        if let (Some(api), false) = (&e.api, cluster.store_only) {
            command.args(["--vip-api", api]);
        }
    }
    if !cluster.store_only {
        command.args(["--listen-api", &m.api_addr()]);
        command.args(&cluster.controller_flags);
        // Every member serves cluster DNS on the port after the API's: containerd hosts' pods
        // resolve names with it, and it answers anyone on this machine for a simulated one.
        command.args(["--listen-dns", &m.dns_addr()]);
        if let Some(net) = &cluster.network {
            // LoadBalancer Services get addresses on the hosts' bridge network, which the
            // nodes answer for.
            command.args(["--load-balancer-ip-range", &net.load_balancer_range()]);
        }
    }
    command
        .args(["--initial-cluster", &cluster.initial_cluster()])
        .args(["--initial-cluster-token", &cluster.token])
        .arg("--pki")
        .arg(abs.join("pki"))
        .args(["--snapshot-count", &cluster.snapshot_count.to_string()])
        .args([
            "--snapshot-catchup-entries",
            &cluster.snapshot_catchup_entries.to_string(),
        ])
        .args([
            "--heartbeat-interval",
            &cluster.heartbeat_interval.to_string(),
        ])
        .args(["--election-timeout", &cluster.election_timeout.to_string()])
        .args([
            "--quota-backend-bytes",
            &cluster.quota_backend_bytes.to_string(),
        ])
        .args([
            "--worker-threads",
            &worker_share(cluster.members.len()).to_string(),
        ])
        .args(cluster.unsafe_no_fsync.then_some("--unsafe-no-fsync"))
        .args(extra);
    if cluster.snapshot_interval_ms > 0 {
        command
            .args([
                "--snapshot-interval",
                &format!("{}ms", cluster.snapshot_interval_ms),
                "--snapshot-retain",
                &cluster.snapshot_retain.to_string(),
            ])
            .arg("--snapshot-dir")
            .arg(cluster.snapshot_dir(&abs, &m.name))
            .args(cluster.snapshot_compress.then_some("--snapshot-compress"));
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C in the terminal reaches `up`, which stops members in order.
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot start server {}", m.name))?;
    let pid = child.id() as i32;
    std::fs::write(pid_path(dir, &m.name), pid.to_string())?;
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::worker_share;

    #[test]
    fn members_on_one_machine_divide_its_cpus_between_them() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(worker_share(1), cpus);
        assert_eq!(worker_share(0), cpus, "no members is taken as one");
        assert_eq!(worker_share(cpus + 1), 1, "never less than one thread");
        assert!(worker_share(3) * 3 <= cpus.max(3));
    }
}
