//! `rkube token create|list|delete`: bootstrap tokens, as `kubeadm token` manages them —
//! Secrets `kube-system/bootstrap-token-<id>` written through the Kubernetes API with an
//! admin's credentials (a kubeconfig).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use rand::Rng;
use serde_json::{json, Value};

use rkube_core::bootstrap_token as bt;

#[derive(Debug, Clone, Args)]
pub struct TokenArgs {
    /// The admin kubeconfig (default: $KUBECONFIG, or DIR/admin.kubeconfig with --dir).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// A local cluster's directory, as made by `rkube up`.
    #[arg(long, global = true)]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a bootstrap token (a random one unless TOKEN is given).
    Create {
        token: Option<String>,
        /// How long the token lasts (0: forever).
        #[arg(long, default_value = "24h", value_parser = crate::flags::parse_duration)]
        ttl: Duration,
        /// Comma-separated: signing (cluster-info), authentication (joining).
        #[arg(long, default_value = "signing,authentication")]
        usages: String,
        /// Extra groups the token authenticates with (each under system:bootstrappers:).
        #[arg(
            long,
            default_value = "system:bootstrappers:kubeadm:default-node-token"
        )]
        groups: String,
        #[arg(long, default_value = "")]
        description: String,
        /// Print the `rkube agent` command that joins a node with this token.
        #[arg(long)]
        print_join_command: bool,
    },
    /// List the bootstrap tokens.
    List,
    /// Delete bootstrap tokens (by id or whole token).
    Delete {
        #[arg(required = true)]
        tokens: Vec<String>,
    },
}

/// A client from the kubeconfig, and the server it names (for join commands).
pub async fn admin_client(args: &TokenArgs) -> Result<(kube::Client, String)> {
    let path = match (&args.kubeconfig, &args.dir) {
        (Some(p), _) => p.clone(),
        (None, Some(d)) => d.join(crate::up::KUBECONFIG_FILE),
        (None, None) => std::env::var_os("KUBECONFIG")
            .map(PathBuf::from)
            .ok_or_else(|| {
                anyhow!("no kubeconfig: pass --kubeconfig or --dir, or set KUBECONFIG")
            })?,
    };
    client_from(&path).await
}

async fn client_from(path: &Path) -> Result<(kube::Client, String)> {
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    let server = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    Ok((kube::Client::try_from(config)?, server))
}

pub fn random(n: usize) -> String {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..n)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect()
}

/// A new token's Secret.
pub fn token_secret(
    token: &str,
    ttl: Duration,
    usages: &str,
    groups: &str,
    description: &str,
) -> Result<Value> {
    let (id, secret) = bt::parse(token).ok_or_else(|| {
        anyhow!(
            "{token:?} is not a bootstrap token: it must look like [a-z0-9]{{6}}.[a-z0-9]{{16}}"
        )
    })?;
    let mut data = serde_json::Map::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), json!(STANDARD.encode(v)));
    };
    put("token-id", id);
    put("token-secret", secret);
    if !description.is_empty() {
        put("description", description);
    }
    if !ttl.is_zero() {
        let exp = chrono::Utc::now() + chrono::Duration::from_std(ttl)?;
        put(
            "expiration",
            &exp.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
    }
    for u in usages.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        if u != "signing" && u != "authentication" {
            bail!("unknown usage {u:?}: use signing and/or authentication");
        }
        put(&format!("usage-bootstrap-{u}"), "true");
    }
    let groups: Vec<&str> = groups
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .collect();
    for g in &groups {
        if !g.starts_with("system:bootstrappers:") {
            bail!("group {g:?} must start with system:bootstrappers:");
        }
    }
    if !groups.is_empty() {
        put("auth-extra-groups", &groups.join(","));
    }
    Ok(
        json!({"apiVersion": "v1", "kind": "Secret", "type": bt::SECRET_TYPE,
              "metadata": {"name": format!("{}{id}", bt::SECRET_PREFIX), "namespace": "kube-system"},
              "data": data}),
    )
}

/// Creates a token through `client`; returns it.
pub async fn create(
    client: kube::Client,
    token: Option<String>,
    ttl: Duration,
    usages: &str,
    groups: &str,
    description: &str,
) -> Result<String> {
    let token = token.unwrap_or_else(|| format!("{}.{}", random(6), random(16)));
    let secret: Secret =
        serde_json::from_value(token_secret(&token, ttl, usages, groups, description)?)?;
    Api::<Secret>::namespaced(client, "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .map_err(|e| match e {
            kube::Error::Api(ref s) if s.code == 409 => {
                anyhow!("a token with this id already exists")
            }
            e => anyhow!(e),
        })?;
    Ok(token)
}

pub async fn run(args: TokenArgs, command: TokenCommand) -> Result<()> {
    let (client, server) = admin_client(&args).await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    match command {
        TokenCommand::Create {
            token,
            ttl,
            usages,
            groups,
            description,
            print_join_command,
        } => {
            let token = create(client, token, ttl, &usages, &groups, &description).await?;
            if print_join_command {
                let ca = ca_hash(&args)?;
                println!("rkube agent --server {server} --token {token} --discovery-token-ca-cert-hash {ca}");
            } else {
                println!("{token}");
            }
        }
        TokenCommand::List => {
            let list = api
                .list(&ListParams::default().fields(&format!("type={}", bt::SECRET_TYPE)))
                .await?;
            println!(
                "{:<24}{:<8}{:<22}{:<32}{:<26}EXTRA GROUPS",
                "TOKEN", "TTL", "EXPIRES", "USAGES", "DESCRIPTION"
            );
            let now = chrono::Utc::now();
            for s in list.items {
                let get = |k: &str| bt::secret_value(&s, k).unwrap_or_default();
                let token = format!("{}.{}", get("token-id"), get("token-secret"));
                let (ttl, expires) = match chrono::DateTime::parse_from_rfc3339(&get("expiration"))
                {
                    Ok(t) => {
                        let left = (t.with_timezone(&chrono::Utc) - now).num_seconds();
                        let ttl = if left <= 0 {
                            "<invalid>".to_string()
                        } else if left >= 3600 {
                            format!("{}h", left / 3600)
                        } else {
                            format!("{}m", (left / 60).max(1))
                        };
                        (ttl, get("expiration"))
                    }
                    Err(_) => ("<forever>".into(), "<never>".into()),
                };
                let usages: Vec<&str> = ["authentication", "signing"]
                    .into_iter()
                    .filter(|u| get(&format!("usage-bootstrap-{u}")) == "true")
                    .collect();
                let desc = match get("description") {
                    d if d.is_empty() => "<none>".to_string(),
                    d => d,
                };
                println!(
                    "{token:<24}{ttl:<8}{expires:<22}{:<32}{desc:<26}{}",
                    usages.join(","),
                    get("auth-extra-groups")
                );
            }
        }
        TokenCommand::Delete { tokens } => {
            for t in tokens {
                let id = t.split('.').next().unwrap_or("").to_string();
                if id.len() != 6 {
                    bail!("{t:?} is neither a token id nor a token");
                }
                match api
                    .delete(
                        &format!("{}{id}", bt::SECRET_PREFIX),
                        &DeleteParams::default(),
                    )
                    .await
                {
                    Ok(_) => println!("bootstrap token {id:?} deleted"),
                    Err(kube::Error::Api(e)) if e.code == 404 => {
                        bail!("bootstrap token {id:?} not found")
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

/// The CA pin of the cluster the kubeconfig reaches: from DIR/pki/ca.crt, or the kubeconfig's
/// own certificate-authority-data.
fn ca_hash(args: &TokenArgs) -> Result<String> {
    if let Some(dir) = &args.dir {
        let pem = std::fs::read(dir.join("pki").join(rkube_pki::CA_CERT_FILE))?;
        return Ok(rkube_pki::ca_spki_sha256(&pem)?);
    }
    let path = args
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .ok_or_else(|| anyhow!("no kubeconfig"))?;
    let kc = kube::config::Kubeconfig::read_from(&path)?;
    let data = kc
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .and_then(|c| c.certificate_authority_data.clone())
        .ok_or_else(|| anyhow!("the kubeconfig carries no certificate-authority-data"))?;
    let pem = STANDARD.decode(data)?;
    Ok(rkube_pki::ca_spki_sha256(&pem)?)
}
