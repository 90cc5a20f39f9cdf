//! `rkube recover`: guided recovery of a control plane that lost its quorum.
//!
//! Reads the stopped members' data dirs offline (their vote, last log entry, commit and applied
//! index, revision), then says what to do: when members holding data are still a quorum, start
//! them, and replace the members whose data is gone (removed, their dir set aside, added back
//! as learners with an empty one, promoted once caught up); when they are not, keep the most
//! up-to-date one (Raft's order: last log term, then index) as a new one-member cluster
//! (`--force-new-cluster`, which applies what its log holds first) and add every other member
//! back the same way. With `--dir` (a local cluster of `rkube up`) and `--yes` it carries the
//! plan out; for data dirs on hosts (`--data-dir`) it prints the commands.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use rkube_store::proto::etcdserverpb as pb;
use rkube_store::server::recovery::{inspect, InspectError, MemberState};

use crate::client::{ClusterArgs, Target};
use crate::up::{running_pid, LocalCluster, LocalMember};

#[derive(Debug, clap::Args)]
pub struct RecoverArgs {
    /// A local cluster's directory (`rkube up`): every member's data dir is read, and the plan
    /// is carried out with --yes.
    #[arg(long, conflicts_with = "data_dir")]
    pub dir: Option<PathBuf>,
    /// Data dirs of stopped members on this host (repeat the flag): read and compared, and the
    /// plan printed as commands to run on the hosts.
    #[arg(long)]
    pub data_dir: Vec<PathBuf>,
    /// Carry out the plan (with --dir).
    #[arg(long, requires = "dir")]
    pub yes: bool,
}

/// One member as found.
enum Found {
    Running(i32),
    Stopped(MemberState),
    /// No data dir, or one that cannot be read: the member's data is gone.
    Lost(String),
}

pub async fn run(args: RecoverArgs) -> Result<()> {
    match &args.dir {
        Some(dir) => local(dir, args.yes).await,
        None if args.data_dir.is_empty() => {
            bail!(
                "give --dir DIR (a local cluster) or --data-dir for each stopped member's data dir"
            )
        }
        None => hosts(&args.data_dir).await,
    }
}

fn print_table(rows: &[(String, String, Option<&MemberState>)]) {
    println!(
        "{:<8} {:<28} {:>6} {:>14} {:>10} {:>10} {:>10}",
        "NAME", "STATE", "TERM", "LAST LOG", "COMMITTED", "APPLIED", "REVISION"
    );
    for (name, state, s) in rows {
        match s {
            Some(s) => println!(
                "{:<8} {:<28} {:>6} {:>14} {:>10} {:>10} {:>10}",
                name,
                state,
                s.term,
                format!("{}/{}", s.last_log_term, s.last_log_index),
                s.committed_index,
                s.applied_index,
                s.revision
            ),
            None => println!("{name:<8} {state:<28}"),
        }
    }
}

/// The most up-to-date of `states`.
fn freshest<'a>(states: impl IntoIterator<Item = &'a MemberState>) -> Option<&'a MemberState> {
    states.into_iter().max_by_key(|s| s.freshness())
}

async fn hosts(dirs: &[PathBuf]) -> Result<()> {
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut states = Vec::new();
    for dir in dirs {
        match inspect(dir).await {
            Ok(s) => {
                rows.push((s.name.clone(), format!("stopped ({})", dir.display())));
                states.push(s);
            }
            Err(e) => rows.push((dir.display().to_string(), e.to_string())),
        }
    }
    let rows: Vec<(String, String, Option<&MemberState>)> = rows
        .into_iter()
        .map(|(n, st)| {
            let s = states.iter().find(|s| s.name == n);
            (n, st, s)
        })
        .collect();
    print_table(&rows);
    let Some(keep) = freshest(&states) else {
        bail!("no readable data dir: nothing to recover from (restore a snapshot instead)");
    };
    let voters = keep.voters.len().max(1);
    println!();
    if states.len() > voters / 2 {
        println!(
            "The data dirs given hold {} of the {voters} voters: a quorum. Start those members as they were (no forced recovery).",
            states.len()
        );
    } else {
        println!(
            "Keep {} (the most up to date: last log {}/{}, applied {}). On its host, once:",
            keep.name, keep.last_log_term, keep.last_log_index, keep.applied_index
        );
        println!(
            "  rkube server --name {} --data-dir <its data dir> ... --force-new-cluster",
            keep.name
        );
        println!("then for every other member: set its data dir aside, and on a running member");
        println!("  rkube member add <name> --peer-url https://<its peer address> --learner");
        println!("start it with --initial-cluster-state existing and an empty data dir, and");
        println!("  rkube member promote <id>      # once it has caught up");
        println!("Drop --force-new-cluster from the kept member's command line afterwards.");
    }
    Ok(())
}

async fn find(dir: &Path, m: &LocalMember) -> Found {
    if let Some(pid) = running_pid(dir, &m.name) {
        return Found::Running(pid);
    }
    let data = dir.join(&m.name);
    // A member killed a moment ago may hold its lock while its last threads exit.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match inspect(&data).await {
            Ok(s) => return Found::Stopped(s),
            Err(InspectError::Running { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Found::Lost(e.to_string()),
        }
    }
}

/// What to do, in order.
enum Step {
    Start(String),
    Stop(String),
    Force(String),
    Replace(String),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Start(n) => write!(f, "start {n} from its data dir"),
            Step::Stop(n) => write!(f, "stop {n} (it runs without a quorum) and read its data dir"),
            Step::Force(n) => write!(f, "start {n} as a new one-member cluster with its data (--force-new-cluster)"),
            Step::Replace(n) => write!(
                f,
                "replace {n}: remove it, set its data dir aside, add it back as a learner with an empty one, promote it once caught up"
            ),
        }
    }
}

async fn local(dir: &Path, yes: bool) -> Result<()> {
    let cluster = LocalCluster::load(dir)?;
    let mut found = Vec::new();
    for m in &cluster.members {
        found.push((m.name.clone(), find(dir, m).await));
    }
    let rows: Vec<(String, String, Option<&MemberState>)> = found
        .iter()
        .map(|(n, f)| match f {
            Found::Running(pid) => (n.clone(), format!("running (pid {pid})"), None),
            Found::Stopped(s) => (n.clone(), "stopped".into(), Some(s)),
            Found::Lost(why) => (n.clone(), format!("data lost: {why}"), None),
        })
        .collect();
    print_table(&rows);
    let quorum = cluster.members.len() / 2 + 1;
    let running: Vec<&str> = found
        .iter()
        .filter(|(_, f)| matches!(f, Found::Running(_)))
        .map(|(n, _)| n.as_str())
        .collect();
    let stopped: Vec<&MemberState> = found
        .iter()
        .filter_map(|(_, f)| match f {
            Found::Stopped(s) => Some(s),
            _ => None,
        })
        .collect();
    let lost: Vec<&str> = found
        .iter()
        .filter(|(_, f)| matches!(f, Found::Lost(_)))
        .map(|(n, _)| n.as_str())
        .collect();
    let mut plan = Vec::new();
    if running.len() + stopped.len() >= quorum {
        println!(
            "\n{} of {} members hold their data: a quorum, so no forced recovery.",
            running.len() + stopped.len(),
            cluster.members.len()
        );
        plan.extend(stopped.iter().map(|s| Step::Start(s.name.clone())));
        plan.extend(lost.iter().map(|n| Step::Replace(n.to_string())));
    } else if !running.is_empty() {
        // The running ones must be read too before one is chosen.
        plan.extend(running.iter().map(|n| Step::Stop(n.to_string())));
        println!(
            "\nOnly {} of {} members hold their data: fewer than a quorum of {quorum}. The running ones are stopped and read, then the most up to date is kept and every other member replaced.",
            running.len() + stopped.len(),
            cluster.members.len()
        );
    } else {
        let keep = freshest(stopped.iter().copied()).ok_or_else(|| {
            anyhow!(
                "no member holds its data: restore a snapshot instead (`rkube up --restore FILE`)"
            )
        })?;
        println!(
            "\nOnly {} of {} members hold their data: fewer than a quorum of {quorum}. Keep {} (the most up to date: last log {}/{}, applied {}, revision {}).",
            stopped.len(),
            cluster.members.len(),
            keep.name,
            keep.last_log_term,
            keep.last_log_index,
            keep.applied_index,
            keep.revision
        );
        plan.push(Step::Force(keep.name.clone()));
        for m in &cluster.members {
            if m.name != keep.name {
                plan.push(Step::Replace(m.name.clone()));
            }
        }
    }
    if plan.is_empty() {
        println!("Nothing to do.");
        return Ok(());
    }
    println!("Plan:");
    for (i, step) in plan.iter().enumerate() {
        println!("  {}. {step}", i + 1);
    }
    if !yes {
        println!("Run again with --yes to carry it out.");
        return Ok(());
    }
    if plan.iter().any(|s| matches!(s, Step::Stop(_))) {
        let names: Vec<String> = running.iter().map(|n| n.to_string()).collect();
        crate::up::stop(dir, &names).await;
        // Read again, now that every member is stopped, and carry out that plan.
        return Box::pin(local(dir, yes)).await;
    }
    let target = ClusterArgs {
        endpoints: None,
        cacert: None,
        cert: None,
        key: None,
        dir: Some(dir.to_path_buf()),
        insecure: false,
    }
    .resolve()?;
    for step in &plan {
        println!("{step}");
        match step {
            Step::Start(name) => {
                let m = member(&cluster, name)?;
                let pid = crate::up::spawn_member(dir, &cluster, m, &[])?;
                println!("  started {name} (pid {pid})");
            }
            Step::Force(name) => {
                let m = member(&cluster, name)?;
                let pid = crate::up::spawn_member(dir, &cluster, m, &["--force-new-cluster"])?;
                println!("  started {name} (pid {pid}) as a one-member cluster");
            }
            Step::Stop(_) => unreachable!("handled above"),
            Step::Replace(name) => replace(dir, &cluster, &target, member(&cluster, name)?).await?,
        }
    }
    println!(
        "Recovered: `rkube status --dir {}` shows the members.",
        dir.display()
    );
    Ok(())
}

fn member<'a>(cluster: &'a LocalCluster, name: &str) -> Result<&'a LocalMember> {
    cluster
        .members
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| anyhow!("no member {name} in the cluster's layout"))
}

/// The cluster's member list, from whichever member answers with a leader.
async fn members(target: &Target) -> Result<Vec<pb::Member>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut last = String::new();
        for url in &target.endpoints {
            let mut cluster = pb::cluster_client::ClusterClient::new(target.channel_to(url)?);
            let mut req = tonic::Request::new(pb::MemberListRequest { linearizable: true });
            req.set_timeout(Duration::from_secs(3));
            match cluster.member_list(req).await {
                Ok(r) => return Ok(r.into_inner().members),
                Err(s) => last = format!("{url}: {}", s.message()),
            }
        }
        if Instant::now() > deadline {
            bail!("no member answered with a leader within 60 s ({last})");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Calls `op` on the cluster (any member, retried while it has no leader yet) until it
/// succeeds or `what` times out.
async fn cluster_call<T, F, Fut>(
    target: &Target,
    what: &str,
    timeout: Duration,
    mut op: F,
) -> Result<T>
where
    F: FnMut(pb::cluster_client::ClusterClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let mut last = String::new();
        for url in &target.endpoints {
            let client = pb::cluster_client::ClusterClient::new(target.channel_to(url)?);
            match op(client).await {
                Ok(v) => return Ok(v),
                Err(s) => last = format!("{url}: {}", s.message()),
            }
        }
        if Instant::now() > deadline {
            bail!("{what} did not succeed within {timeout:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn replace(
    dir: &Path,
    cluster: &LocalCluster,
    target: &Target,
    m: &LocalMember,
) -> Result<()> {
    let peer_url = format!("https://{}", m.peer);
    if let Some(old) = members(target)
        .await?
        .into_iter()
        .find(|x| x.name == m.name || x.peer_ur_ls.iter().any(|u| u == &peer_url))
    {
        let id = old.id;
        cluster_call(
            target,
            "removing the member",
            Duration::from_secs(60),
            |mut c| async move {
                c.member_remove(pb::MemberRemoveRequest { id })
                    .await
                    .map(|_| ())
            },
        )
        .await?;
        println!("  removed {} ({id:x})", m.name);
    }
    let data = dir.join(&m.name);
    if data.exists() {
        let aside = dir.join(format!(
            "{}.lost-{}",
            m.name,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        ));
        std::fs::rename(&data, &aside)
            .with_context(|| format!("setting {} aside", data.display()))?;
        println!("  its old data dir is now {}", aside.display());
    }
    let added = cluster_call(
        target,
        "adding the member",
        Duration::from_secs(60),
        |mut c| {
            let peer_url = peer_url.clone();
            async move {
                c.member_add(pb::MemberAddRequest {
                    peer_ur_ls: vec![peer_url],
                    is_learner: true,
                })
                .await
                .map(|r| r.into_inner())
            }
        },
    )
    .await?;
    let id = added.member.map_or(0, |x| x.id);
    println!("  added {} as learner {id:x}", m.name);
    let pid = crate::up::spawn_member(dir, cluster, m, &["--initial-cluster-state", "existing"])?;
    println!("  started {} (pid {pid}), catching up", m.name);
    cluster_call(
        target,
        "promoting the learner",
        Duration::from_secs(300),
        |mut c| async move {
            c.member_promote(pb::MemberPromoteRequest { id })
                .await
                .map(|_| ())
        },
    )
    .await?;
    println!("  promoted {} to voter", m.name);
    Ok(())
}
