//! The campaign's hosts: one network namespace per member, each with its own address on a
//! bridge of this machine, so that every member is a host of its own and the fault proxies
//! (which run on this machine, at the bridge's address) know from a connection's source
//! address which member opened it.
//!
//! Bridge `rkc` + 6 hex digits holding 10.X.0.1/24 (X from 150..199, one no interface of this
//! machine uses); member i at 10.X.0.(11 + i) in namespace `<bridge>-m<i>`. Dropping the
//! [`Hosts`] removes all of it.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Runs `ip` (or another tool); its output, or an error naming the command and its stderr.
pub fn sh(program: &str, args: &[&str]) -> Result<String> {
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
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Why hosts of their own cannot be made here, if they cannot.
pub fn unavailable() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("the campaign makes network namespaces and a bridge, which needs root".into());
    }
    if sh("ip", &["-V"]).is_err() {
        return Some("ip (iproute2) is not installed".into());
    }
    None
}

pub struct Hosts {
    pub bridge: String,
    pub octet: u8,
    pub members: usize,
}

impl Hosts {
    /// The bridge and `members` namespaces, each with its address and a route to the bridge.
    pub fn create(members: usize) -> Result<Self> {
        let used = sh("ip", &["-4", "-o", "addr", "show"])?;
        let octet = (150..200u8)
            .filter(|x| !used.contains(&format!("inet 10.{x}.")))
            .nth(rand::random::<usize>() % 8)
            .context("no free 10.X.0.0/16 among 10.150-199 for the campaign's bridge")?;
        let hosts = Self {
            bridge: format!("rkc{:06x}", rand::random::<u32>() & 0xff_ffff),
            octet,
            members,
        };
        hosts.set_up().inspect_err(|_| hosts.tear_down())?;
        Ok(hosts)
    }

    fn set_up(&self) -> Result<()> {
        let b = self.bridge.as_str();
        sh("ip", &["link", "add", b, "type", "bridge"])?;
        sh(
            "ip",
            &["addr", "add", &format!("{}/24", self.host_ip()), "dev", b],
        )?;
        sh("ip", &["link", "set", b, "up"])?;
        for i in 0..self.members {
            let ns = self.netns(i);
            let (outer, inner) = (format!("{b}h{i}"), format!("{b}m{i}"));
            sh("ip", &["netns", "add", &ns])?;
            sh(
                "ip",
                &[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner,
                ],
            )?;
            sh("ip", &["link", "set", &outer, "master", b, "up"])?;
            sh("ip", &["link", "set", &inner, "netns", &ns])?;
            let in_ns = |args: &[&str]| {
                let mut all = vec!["netns", "exec", ns.as_str(), "ip"];
                all.extend_from_slice(args);
                sh("ip", &all)
            };
            in_ns(&[
                "addr",
                "add",
                &format!("{}/24", self.member_ip(i)),
                "dev",
                &inner,
            ])?;
            in_ns(&["link", "set", &inner, "up"])?;
            in_ns(&["link", "set", "lo", "up"])?;
            in_ns(&[
                "route",
                "add",
                "default",
                "via",
                &self.host_ip().to_string(),
            ])?;
        }
        Ok(())
    }

    fn tear_down(&self) {
        for i in 0..self.members {
            let _ = sh("ip", &["netns", "delete", &self.netns(i)]);
        }
        let _ = sh("ip", &["link", "delete", &self.bridge]);
    }

    /// This machine's address on the bridge: where the fault proxies listen.
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, 0, 1)
    }

    pub fn member_ip(&self, i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, self.octet, 0, 11 + i as u8)
    }

    /// The member whose address this is.
    pub fn member_of(&self, ip: Ipv4Addr) -> Option<usize> {
        let o = ip.octets();
        (o[0] == 10 && o[1] == self.octet && o[2] == 0 && o[3] >= 11)
            .then(|| (o[3] - 11) as usize)
            .filter(|i| *i < self.members)
    }

    pub fn netns(&self, i: usize) -> String {
        format!("{}-m{i}", self.bridge)
    }

    /// A command that runs `program` inside member i's namespace (`ip netns exec` execs it,
    /// so the child's pid is the program's).
    pub fn command(&self, i: usize, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns(i)]).arg(program);
        c
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.tear_down();
    }
}
