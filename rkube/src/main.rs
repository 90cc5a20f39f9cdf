//! rkube: a Kubernetes-compatible control plane in one binary. This crate only wires the
//! command line to the components.

mod agent;
mod backup;
mod bench;
mod client;
mod flags;
mod hosts;
mod image;
mod init;
mod kv;
mod member;
mod recover;
mod server;
mod snapshot;
mod status;
mod token;
mod up;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

/// glibc's malloc, keeping sled's freed log buffers for reuse (see the module).
#[global_allocator]
static ALLOCATOR: rkube_store::segment_buffers::Allocator =
    rkube_store::segment_buffers::Allocator::new();

#[derive(Debug, Parser)]
#[command(
    name = "rkube",
    version,
    about = "A Kubernetes-compatible control plane with a built-in Raft store"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one control-plane server.
    Server(Box<server::ServerArgs>),
    /// Start a local HA cluster: servers on this machine, agents as hosts of their own.
    Up(up::UpArgs),
    /// Stop a local cluster started with `up --detach` (and remove its hosts' network).
    Down(up::DownArgs),
    /// Images on the local cluster's nodes.
    Image(image::ImageArgs),
    /// Read and write keys of the store.
    Kv {
        #[command(flatten)]
        cluster: client::ClusterArgs,
        #[command(subcommand)]
        command: kv::KvCommand,
    },
    /// Manage leases.
    Lease {
        #[command(flatten)]
        cluster: client::ClusterArgs,
        #[command(subcommand)]
        command: kv::LeaseCommand,
    },
    /// Show every member's role, term, indexes, revision and size.
    Status {
        #[command(flatten)]
        cluster: client::ClusterArgs,
        /// Output format: table or json.
        #[arg(short = 'o', long, default_value = "table")]
        output: String,
    },
    /// List, add, promote and remove control-plane members.
    Member {
        #[command(flatten)]
        cluster: client::ClusterArgs,
        #[command(subcommand)]
        command: member::MemberCommand,
    },
    /// Save, inspect and restore snapshots of the store.
    Snapshot {
        #[command(flatten)]
        cluster: client::ClusterArgs,
        #[command(subcommand)]
        command: snapshot::SnapshotCommand,
    },
    /// Run a node agent (rkube's kubelet): join with a bootstrap token, register the node,
    /// run the pods bound to it.
    Agent(Box<agent::AgentArgs>),
    /// Create, list and delete bootstrap tokens.
    Token {
        #[command(flatten)]
        args: token::TokenArgs,
        #[command(subcommand)]
        command: token::TokenCommand,
    },
    /// Upload the control-plane keys again under a certificate key (kubeadm's `init phase
    /// upload-certs`), so that a member can join after the ones `--init` uploaded expired.
    UploadCerts(Box<init::UploadCertsArgs>),
    /// Bring a control plane that lost its quorum back: read the members' data dirs, name the
    /// member to keep, and (with --dir and --yes) carry out the plan.
    Recover(recover::RecoverArgs),
    /// Export the cluster's desired state as YAML, or apply such an export.
    Backup {
        #[command(flatten)]
        args: token::TokenArgs,
        #[command(subcommand)]
        command: backup::BackupCommand,
    },
    /// Benchmarks against a running cluster.
    Bench {
        #[command(flatten)]
        cluster: client::ClusterArgs,
        #[command(subcommand)]
        command: bench::BenchCommand,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RKUBE_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(
                    "info,openraft=warn,sled=warn,h2=warn,tower=warn",
                )
            }),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal, not in log files.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Command::Server(args) = &cli.command {
        if let Some(n) = args.worker_threads() {
            runtime.worker_threads(n);
        }
    }
    let result = match runtime.build() {
        Ok(runtime) => runtime.block_on(run(cli)),
        Err(e) => Err(anyhow::anyhow!("cannot start the async runtime: {e}")),
    };
    if let Err(e) = result {
        eprintln!("Error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Server(args) => server::run(*args).await,
        Command::Up(args) => up::up(args).await,
        Command::Agent(args) => agent::run(*args).await,
        Command::Token { args, command } => token::run(args, command).await,
        Command::Backup { args, command } => backup::run(args, command).await,
        Command::Recover(args) => recover::run(args).await,
        Command::UploadCerts(args) => init::upload_certs(*args).await,
        Command::Down(args) => up::down(args).await,
        Command::Image(args) => image::run(args),
        Command::Kv { cluster, command } => {
            let ch = cluster.resolve()?.connect().await?;
            kv::run(ch, command).await
        }
        Command::Lease { cluster, command } => {
            let ch = cluster.resolve()?.connect().await?;
            kv::lease(ch, command).await
        }
        Command::Status { cluster, output } => {
            let target = cluster.resolve()?;
            status::run(&target, output == "json")
                .await
                .context("status")
        }
        Command::Member { cluster, command } => {
            let target = cluster.resolve()?;
            let ch = target.connect().await?;
            member::run(&target, ch, command).await
        }
        Command::Snapshot { cluster, command } => {
            let ch = match command {
                snapshot::SnapshotCommand::Save { .. } => Some(cluster.resolve()?.connect().await?),
                _ => None,
            };
            snapshot::run(ch, cluster.dir.as_deref(), command).await
        }
        Command::Bench { cluster, command } => bench::run(&cluster, command).await,
    }
}
