//! `rkube up --runtime cri`: every agent is a host of its own, as kind's nodes are. `up` makes
//! a bridge on this machine (`rkb` + 6 hex digits) holding 10.X.0.1/24, and per agent a network
//! namespace with its own address (10.X.0.<i+1>) on that bridge, its own containerd (root,
//! state, socket and CNI configuration under DIR/agents/agent<i>-containerd/, never the
//! system's) and its own pod CIDR (10.X.<i>.0/24). Routes join them: this machine routes each
//! pod CIDR to its node, each node routes the other nodes' pod CIDRs to them, so pods reach each
//! other without NAT and the host reaches every pod. `rkube down` removes all of it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Where the CNI plugins are installed: Debian's containernetworking-plugins, or upstream's.
const CNI_BIN_DIRS: [&str; 2] = ["/usr/lib/cni", "/opt/cni/bin"];

/// The cluster's hosts network: recorded in cluster.json when the DIR is made.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostNetwork {
    /// The bridge on this machine.
    pub bridge: String,
    /// X in 10.X.0.0/16, the addresses of this cluster's hosts and pods.
    pub octet: u8,
}

/// Why the containerd runtime cannot be used on this machine, if it cannot.
pub fn cri_unavailable() -> Option<String> {
    if which("containerd").is_none() || which("ctr").is_none() {
        return Some("containerd is not installed".into());
    }
    if which("runc").is_none() {
        return Some("runc is not installed".into());
    }
    if cni_bin_dir().is_none() {
        return Some(format!(
            "the CNI plugins are not installed (no bridge plugin in {})",
            CNI_BIN_DIRS.join(" or ")
        ));
    }
    if which("ip").is_none() {
        return Some("ip (iproute2) is not installed".into());
    }
    if unsafe { libc::geteuid() } != 0 {
        return Some("it makes network namespaces, a bridge and routes, which needs root".into());
    }
    None
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

fn cni_bin_dir() -> Option<&'static str> {
    CNI_BIN_DIRS
        .into_iter()
        .find(|d| Path::new(d).join("bridge").is_file())
}

/// Runs a command; its standard output, or an error with its standard error.
fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// An IPv4 CIDR's first and last address.
fn range(cidr: &str) -> Option<(u32, u32)> {
    let (addr, len) = cidr.split_once('/').unwrap_or((cidr, "32"));
    let addr: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok().filter(|l| *l <= 32)?;
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    let first = u32::from(addr) & mask;
    Some((first, first | !mask))
}

/// The second octets X whose 10.X.0.0/16 overlaps a network in `ip` output (addresses and
/// routes, the default route aside).
fn used_octets(ip_output: &str) -> Vec<u8> {
    let mut used = Vec::new();
    for word in ip_output.split_whitespace() {
        let Some((first, last)) = range(word).filter(|_| word.contains('.')) else {
            continue;
        };
        if last - first == u32::MAX {
            continue;
        }
        for x in 0..=255u8 {
            let (a, b) = range(&format!("10.{x}.0.0/16")).expect("a valid CIDR");
            if first <= b && a <= last {
                used.push(x);
            }
        }
    }
    used.sort();
    used.dedup();
    used
}

impl HostNetwork {
    /// A bridge name and a 10.X.0.0/16 that no address or route on this machine overlaps.
    pub fn choose() -> Result<HostNetwork> {
        let mut seen = run("ip", &["-4", "-o", "addr", "show"])?;
        seen.push_str(&run("ip", &["-4", "route", "show", "table", "all"])?);
        let used = used_octets(&seen);
        let free: Vec<u8> = (200..=250).filter(|x| !used.contains(x)).collect();
        if free.is_empty() {
            bail!("every 10.X.0.0/16 for X in 200..=250 is in use on this machine: no room for the hosts' network");
        }
        Ok(HostNetwork {
            bridge: format!("rkb{:06x}", rand::random::<u32>() & 0xff_ffff),
            octet: free[rand::random::<usize>() % free.len()],
        })
    }

    pub fn host_ip(&self) -> String {
        format!("10.{}.0.1", self.octet)
    }

    pub fn node_ip(&self, i: usize) -> String {
        format!("10.{}.0.{}", self.octet, i + 1)
    }

    /// The addresses LoadBalancer Services get: the top of the hosts' /24.
    pub fn load_balancer_range(&self) -> String {
        format!("10.{o}.0.200-10.{o}.0.250", o = self.octet)
    }

    pub fn pod_cidr(&self, i: usize) -> String {
        format!("10.{}.{i}.0/24", self.octet)
    }

    pub fn netns(&self, agent: &str) -> String {
        format!("{}-{agent}", self.bridge)
    }

    fn veth(&self, i: usize) -> String {
        format!("{}v{i}", self.bridge)
    }

    /// The pid-file name of an agent's containerd (also its directory's name, which is how its
    /// command line is recognised).
    pub fn containerd_name(agent: &str) -> String {
        format!("{agent}-containerd")
    }

    pub fn containerd_dir(&self, abs: &Path, agent: &str) -> PathBuf {
        abs.join("agents").join(Self::containerd_name(agent))
    }

    pub fn containerd_socket(&self, abs: &Path, agent: &str) -> PathBuf {
        self.containerd_dir(abs, agent).join("c.sock")
    }

    pub fn cni_dir(&self, abs: &Path, agent: &str) -> PathBuf {
        self.containerd_dir(abs, agent).join("cni")
    }

    /// Makes what is missing of the bridge, the agents' namespaces, their addresses and the
    /// routes (an existing DIR after `rkube down` gets them back).
    pub fn set_up(&self, agents: &[String]) -> Result<()> {
        let host = self.host_ip();
        if run("ip", &["link", "show", &self.bridge]).is_err() {
            run("ip", &["link", "add", &self.bridge, "type", "bridge"])?;
            run(
                "ip",
                &["addr", "add", &format!("{host}/24"), "dev", &self.bridge],
            )?;
        }
        run("ip", &["link", "set", &self.bridge, "up"])?;
        for (i, agent) in agents.iter().enumerate() {
            let i = i + 1;
            let ns = self.netns(agent);
            if !Path::new("/run/netns").join(&ns).exists() {
                run("ip", &["netns", "add", &ns])?;
                let veth = self.veth(i);
                run(
                    "ip",
                    &[
                        "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
                    ],
                )?;
                run("ip", &["link", "set", &veth, "master", &self.bridge, "up"])?;
                let addr = format!("{}/24", self.node_ip(i));
                run("ip", &["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;
                run("ip", &["-n", &ns, "link", "set", "eth0", "up"])?;
                run("ip", &["-n", &ns, "link", "set", "lo", "up"])?;
                run("ip", &["-n", &ns, "route", "add", "default", "via", &host])?;
                // The node forwards between its pods' bridge and the hosts' network.
                let mut forward = Command::new("sh");
                forward.args(["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
                let _ns = self.enter(&mut forward, agent)?;
                let status = forward.status()?;
                if !status.success() {
                    bail!("turning on IPv4 forwarding in {ns}: {status}");
                }
            }
            for j in (1..=agents.len()).filter(|j| *j != i) {
                let (cidr, via) = (self.pod_cidr(j), self.node_ip(j));
                run("ip", &["-n", &ns, "route", "replace", &cidr, "via", &via])?;
            }
            let (cidr, via) = (self.pod_cidr(i), self.node_ip(i));
            run("ip", &["route", "replace", &cidr, "via", &via])?;
        }
        // With bridge netfilter on (Docker turns it on), frames crossing the bridge pass the
        // FORWARD chain, whose policy Docker sets to DROP: let the hosts' traffic through.
        if which("iptables").is_some() && self.forward_rule("-C").is_err() {
            self.forward_rule("-I")?;
        }
        Ok(())
    }

    /// `iptables OP` (check, insert, delete) of the rule that accepts the hosts' traffic across
    /// the bridge in the FORWARD chain.
    fn forward_rule(&self, op: &str) -> Result<String> {
        let bridge = self.bridge.as_str();
        run(
            "iptables",
            &[op, "FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"],
        )
    }

    /// Removes the namespaces, the bridge (its routes go with it) and the FORWARD rule; what is
    /// already gone is skipped.
    pub fn tear_down(&self, agents: &[String]) -> Vec<String> {
        let mut errors = Vec::new();
        for agent in agents {
            let ns = self.netns(agent);
            if Path::new("/run/netns").join(&ns).exists() {
                if let Err(e) = run("ip", &["netns", "del", &ns]) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        if run("ip", &["link", "show", &self.bridge]).is_ok() {
            if let Err(e) = run("ip", &["link", "del", &self.bridge]) {
                errors.push(format!("{e:#}"));
            }
        }
        if which("iptables").is_some() {
            while self.forward_rule("-C").is_ok() {
                if let Err(e) = self.forward_rule("-D") {
                    errors.push(format!("{e:#}"));
                    break;
                }
            }
        }
        errors
    }

    /// Makes `command` run in the agent's network namespace (only that one: the mounts stay
    /// this machine's, so the cgroup filesystem and DIR are where they are). The returned file
    /// must stay open until the command is spawned.
    pub fn enter(&self, command: &mut Command, agent: &str) -> Result<std::fs::File> {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let path = Path::new("/run/netns").join(self.netns(agent));
        let ns = std::fs::File::open(&path)
            .with_context(|| format!("opening the network namespace {}", path.display()))?;
        let fd = ns.as_raw_fd();
        // Between fork and exec only async-signal-safe calls: setns is one.
        unsafe {
            command.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(ns)
    }

    /// Starts the agent's containerd inside its namespace (config, root and state under its
    /// directory); its pid once its socket answers, with the pause image imported.
    pub fn start_containerd(&self, dir: &Path, abs: &Path, agent: &str) -> Result<i32> {
        let d = self.containerd_dir(abs, agent);
        std::fs::create_dir_all(self.cni_dir(abs, agent))?;
        let socket = self.containerd_socket(abs, agent);
        // A unix socket path holds at most 107 bytes; containerd adds ".ttrpc".
        if socket.as_os_str().len() > 100 {
            bail!(
                "{} is too long a path for containerd's socket: use a shorter --dir",
                socket.display()
            );
        }
        let _ = std::fs::remove_file(&socket);
        let config = format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \"{sock}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{pause}\"\n  \
             restrict_oom_score_adj = true\n  [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    \
             bin_dir = \"{bin}\"\n    conf_dir = \"{cni}\"\n",
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = socket.display(),
            pause = crate::image::PAUSE_IMAGE,
            bin = cni_bin_dir().unwrap_or(CNI_BIN_DIRS[0]),
            cni = self.cni_dir(abs, agent).display(),
        );
        let config_path = d.join("config.toml");
        std::fs::write(&config_path, config)?;
        let name = Self::containerd_name(agent);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))?;
        use std::os::unix::process::CommandExt;
        let mut command = Command::new("containerd");
        let _ns = self.enter(&mut command, agent)?;
        let child = command
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let pid = child.id() as i32;
        std::fs::write(dir.join(format!("{name}.pid")), pid.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!(
                    "{name} did not open {} within 30 s; see {}",
                    socket.display(),
                    dir.join(format!("{name}.log")).display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        crate::image::import_pause(&d, &socket)?;
        Ok(pid)
    }

    /// Before an agent's containerd stops: stops and removes its pod sandboxes (their network
    /// namespaces and addresses go with them); the pods start anew when the cluster is up again.
    pub async fn stop_pods(&self, abs: &Path, agent: &str) -> Result<usize> {
        let socket = self.containerd_socket(abs, agent);
        if !socket.exists() {
            return Ok(0);
        }
        let cri =
            rkube_agent::cri::Cri::connect(&socket, &abs.join("agents").join(agent).join("pods"))
                .await?;
        let uids = cri.pod_uids().await?;
        for uid in &uids {
            cri.stop_pod(uid, 0).await?;
        }
        Ok(uids.len())
    }

    /// After an agent's containerd stopped: its shims (which outlive it) are stopped too.
    pub fn stop_shims(&self, abs: &Path, agent: &str) {
        let socket = self.containerd_socket(abs, agent);
        let _ = Command::new("pkill")
            .arg("-f")
            .arg(socket.as_os_str())
            .status();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octets_in_use_are_those_of_overlapping_networks() {
        let ip = "2: eth0    inet 10.201.3.4/24 brd 10.201.3.255 scope global eth0\n\
                  default via 172.17.0.1 dev eth0\n10.0.0.0/8 via 10.201.3.1 dev eth0\n\
                  10.230.0.0/15 dev x\n172.17.0.0/16 dev docker0";
        let used = used_octets(ip);
        assert!(used.contains(&201));
        assert!(used.contains(&230) && used.contains(&231));
        // 10.0.0.0/8 covers them all.
        assert_eq!(used.len(), 256);
        let used = used_octets("10.230.0.0/15 dev x\n10.201.3.4/24 dev y\ndefault via 10.0.0.1");
        assert_eq!(
            used,
            vec![0, 201, 230, 231],
            "the gateway 10.0.0.1 is in 10.0.0.0/16"
        );
    }

    #[test]
    fn node_addresses_and_pod_cidrs() {
        let n = HostNetwork {
            bridge: "rkb00abcd".into(),
            octet: 222,
        };
        assert_eq!(n.host_ip(), "10.222.0.1");
        assert_eq!(n.node_ip(1), "10.222.0.2");
        assert_eq!(n.pod_cidr(2), "10.222.2.0/24");
        assert_eq!(n.netns("agent1"), "rkb00abcd-agent1");
        assert!(n.veth(12).len() <= 15, "an interface name holds 15 bytes");
    }
}
