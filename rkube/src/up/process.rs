//! The members' and agents' processes: found by their pid files in DIR, stopped with signals.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(super) fn pid_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.pid"))
}

/// The pid of a member's running process, if it still runs.
pub fn running_pid(dir: &Path, name: &str) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_path(dir, name))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // Signal 0 checks existence; the command line check guards against a reused pid. Every
    // process `up` starts names its own directory under DIR by absolute path: the name alone
    // would match the member of the same name of another cluster on this machine, which a
    // stale pid file can point at once the pid is reused (then `down` would stop it).
    let alive = unsafe { libc::kill(pid, 0) } == 0;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline);
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let in_dir = cmdline.contains(&format!("{}/", abs.display()));
    let named = cmdline.contains(&format!("{name}\0")) || cmdline.contains(&format!("/{name}/"));
    (alive && in_dir && named).then_some(pid)
}

/// The last `n` lines of a log file (empty if it cannot be read).
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// SIGTERM to the named processes of DIR, SIGKILL to those still running after 10 s.
pub(crate) async fn stop(dir: &Path, names: &[String]) {
    let mut pids = Vec::new();
    for name in names {
        if let Some(pid) = running_pid(dir, name) {
            unsafe { libc::kill(pid, libc::SIGTERM) };
            pids.push((name.clone(), pid));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    for (name, pid) in pids {
        while running_pid(dir, &name).is_some() && Instant::now() < deadline {
            reap(pid);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if running_pid(dir, &name).is_some() {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(pid);
        }
        let _ = std::fs::remove_file(pid_path(dir, &name));
        println!("stopped {name} (pid {pid})");
    }
}

/// How child `pid` of this process ended, if it has: its exit status or the signal that
/// ended it (collecting it). `up` is its members' parent, so this asks the kernel directly
/// rather than reading pid files and command lines (which a process starting up or going
/// away does not always show).
pub(crate) fn ended(pid: i32) -> Option<String> {
    let mut status = 0;
    let reaped = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if reaped != pid {
        return None;
    }
    Some(if libc::WIFSIGNALED(status) {
        format!(
            "(pid {pid}) was killed by signal {}",
            libc::WTERMSIG(status)
        )
    } else {
        format!(
            "(pid {pid}) exited with status {}",
            libc::WEXITSTATUS(status)
        )
    })
}

/// Collects an exited child so it does not linger as a zombie (only our own children).
fn reap(pid: i32) {
    let mut status = 0;
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
}
