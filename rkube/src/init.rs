//! `rkube server --init` and `rkube server --join`: a control plane built host by host, as
//! kubeadm builds one.
//!
//! `--init` makes the cluster CA, the service account key, this member's certificate and an
//! admin kubeconfig, starts a one-member cluster, then creates a bootstrap token and uploads
//! the control-plane keys (the CA key and the service account key) encrypted with a fresh
//! certificate key, and prints the commands that join more control-plane members and workers.
//!
//! `--join` finds the cluster through the bootstrap token (cluster-info, pinned CA), fetches
//! and decrypts the keys with the certificate key, issues its own certificates, is added as a
//! learner and promotes itself once it has caught up.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use rkube_pki as pki;
use rkube_store::proto::etcdserverpb as pb;
use serde_json::{json, Value};

/// The Secret that carries the encrypted control-plane keys (kubeadm's kubeadm-certs).
pub const CERTS_SECRET: &str = "rkube-certs";
/// How long a joining member keeps trying a control plane that is not ready yet (kubeadm's
/// discovery timeout).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(300);
const CERTS_TTL: Duration = Duration::from_secs(2 * 3600);
const ENCRYPTED: &[&str] = &[pki::CA_KEY_FILE, pki::SA_KEY_FILE];

/// The certificate SANs of a member: its listen addresses (when specific), loopback, its name
/// and host name, and any given.
fn sans(name: &str, listens: &[Option<SocketAddr>], extra: &[String]) -> Vec<String> {
    let mut out = vec![
        "127.0.0.1".to_string(),
        "localhost".to_string(),
        name.to_string(),
    ];
    for a in listens.iter().flatten() {
        if !a.ip().is_unspecified() {
            out.push(a.ip().to_string());
        }
    }
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        out.push(h.trim().to_string());
    }
    out.extend(extra.iter().cloned());
    out.sort();
    out.dedup();
    out.retain(|s| !s.is_empty());
    out
}

/// What a member needs in its PKI directory beyond the CA: its certificate and the admin's.
fn issue_member(dir: &Path, name: &str, sans: &[String]) -> Result<()> {
    pki::issue(dir, name, name, None, sans, true, true)?;
    pki::issue(
        dir,
        "admin",
        "kubernetes-admin",
        Some("system:masters"),
        &[],
        false,
        true,
    )?;
    Ok(())
}

/// `<pki>/admin.kubeconfig`: the admin's certificate and this member's API address.
fn write_admin_kubeconfig(dir: &Path, server: &str) -> Result<PathBuf> {
    let b64 = |f: &str| -> Result<String> { Ok(STANDARD.encode(std::fs::read(dir.join(f))?)) };
    let doc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: rkube\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: rkube\n  context:\n    cluster: rkube\n    user: kubernetes-admin\ncurrent-context: rkube\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\npreferences: {{}}\n",
        b64("ca.crt")?,
        b64("admin.crt")?,
        b64("admin.key")?
    );
    let path = dir.join("admin.kubeconfig");
    pki::write_private(&path, doc.as_bytes(), "admin kubeconfig")?;
    Ok(path)
}

fn api_url(listen_api: Option<SocketAddr>, advertise: Option<&str>) -> Result<String> {
    if let Some(a) = advertise {
        return Ok(a.trim_end_matches('/').to_string());
    }
    let a = listen_api.ok_or_else(|| anyhow!("--init and --join need --listen-api"))?;
    if a.ip().is_unspecified() {
        bail!("--listen-api {a} listens on every address: give --advertise-api-url, the address the other hosts reach");
    }
    Ok(format!("https://{a}"))
}

/// The member being set up: its name, PKI directory and addresses.
pub struct Member<'a> {
    pub name: &'a str,
    pub pki: &'a Path,
    pub listen_peer: SocketAddr,
    pub listen_client: SocketAddr,
    pub listen_api: Option<SocketAddr>,
    pub advertise_api: Option<&'a str>,
    pub extra_sans: &'a [String],
}

impl Member<'_> {
    fn api_url(&self) -> Result<String> {
        api_url(self.listen_api, self.advertise_api)
    }

    /// This member's serving/peer certificate and the admin's and kubelet client's.
    fn issue_certificates(&self) -> Result<()> {
        let listens = [
            Some(self.listen_peer),
            Some(self.listen_client),
            self.listen_api,
        ];
        issue_member(
            self.pki,
            self.name,
            &sans(self.name, &listens, self.extra_sans),
        )
    }
}

pub struct InitPlan {
    pub pki: PathBuf,
    pub api_url: String,
    pub client_url: String,
    pub kubeconfig: PathBuf,
    /// Where to write what joining needs (`--join-file`), for hosts that start unattended.
    pub join_file: Option<PathBuf>,
}

/// What a joining member or agent needs, as `--init --join-file` writes it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JoinFile {
    pub server: String,
    pub token: String,
    pub discovery_token_ca_cert_hash: String,
    pub certificate_key: String,
}

impl JoinFile {
    /// Waits (up to `timeout`) for the file `--init` writes, then reads it.
    pub async fn wait_read(path: &std::path::Path, timeout: Duration) -> Result<JoinFile> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match std::fs::read(path) {
                Ok(bytes) => {
                    return serde_json::from_slice(&bytes)
                        .map_err(|e| anyhow!("{}: not a join file: {e}", path.display()))
                }
                Err(_) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(e) => {
                    return Err(anyhow!(
                        "no join file at {} after {timeout:?}: {e} (the first member writes it with --init --join-file)",
                        path.display()
                    ))
                }
            }
        }
    }
}

/// `--init`, before the server starts: the PKI and the one-member initial cluster.
pub fn prepare_init(m: &Member) -> Result<(InitPlan, String)> {
    let api = m.api_url()?;
    pki::init_ca(m.pki)?;
    pki::init_service_account_key(m.pki)?;
    m.issue_certificates()?;
    let kubeconfig = write_admin_kubeconfig(m.pki, &api)?;
    let initial = format!("{}=https://{}", m.name, m.listen_peer);
    Ok((
        InitPlan {
            pki: m.pki.to_path_buf(),
            api_url: api,
            client_url: format!("https://{}", m.listen_client),
            kubeconfig,
            join_file: None,
        },
        initial,
    ))
}

/// AES-256-GCM with a random nonce: base64(nonce || ciphertext || tag).
fn seal(key: &[u8; 32], plain: &[u8]) -> Result<String> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(|_| anyhow!("bad key"))?);
    let nonce: [u8; 12] = rand::random();
    let mut buf = plain.to_vec();
    k.seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
        .map_err(|_| anyhow!("encryption failed"))?;
    let mut out = nonce.to_vec();
    out.extend(buf);
    Ok(STANDARD.encode(out))
}

fn open(key: &[u8; 32], sealed: &str) -> Result<Vec<u8>> {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let raw = STANDARD.decode(sealed)?;
    if raw.len() < 12 + 16 {
        bail!("the encrypted key is too short");
    }
    let (nonce, rest) = raw.split_at(12);
    let k = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).map_err(|_| anyhow!("bad key"))?);
    let mut buf = rest.to_vec();
    let plain = k
        .open_in_place(
            Nonce::try_assume_unique_for_key(nonce).map_err(|_| anyhow!("bad nonce"))?,
            Aad::empty(),
            &mut buf,
        )
        .map_err(|_| anyhow!("the certificate key does not decrypt the control-plane keys: is it the one `rkube server --init` printed, and less than 2 hours old?"))?;
    Ok(plain.to_vec())
}

fn parse_certificate_key(hex: &str) -> Result<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--certificate-key must be 64 hex digits, as `rkube server --init` prints it");
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

/// A fresh certificate key, and its hex form (what `--certificate-key` takes).
fn new_certificate_key() -> ([u8; 32], String) {
    let key: [u8; 32] = rand::random();
    let hex = key.iter().map(|b| format!("{b:02x}")).collect();
    (key, hex)
}

/// The bootstrap token Secret (no usages) that owns the uploaded keys, so that they are
/// deleted with it when it expires after `ttl`.
fn holder_token_secret(ttl: Duration) -> Result<Value> {
    let token = format!("{}.{}", crate::token::random(6), crate::token::random(16));
    crate::token::token_secret(&token, ttl, "", "", "holds the uploaded control-plane keys")
}

/// The Secret with the control-plane keys of `pki_dir` sealed with `key` (the CA certificate and
/// the etcd endpoints in the clear), owned by the created `holder` token Secret.
fn certs_secret(key: &[u8; 32], pki_dir: &Path, client_url: &str, holder: &Value) -> Result<Value> {
    let mut data = serde_json::Map::new();
    data.insert(
        pki::CA_CERT_FILE.into(),
        json!(STANDARD.encode(std::fs::read(pki_dir.join(pki::CA_CERT_FILE))?)),
    );
    for f in ENCRYPTED {
        let plain = std::fs::read(pki_dir.join(f)).with_context(|| {
            format!(
                "reading {} (upload the keys from a control-plane host that has them)",
                pki_dir.join(f).display()
            )
        })?;
        data.insert((*f).into(), json!(STANDARD.encode(seal(key, &plain)?)));
    }
    data.insert("etcd-endpoints".into(), json!(STANDARD.encode(client_url)));
    Ok(
        json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": CERTS_SECRET, "namespace": "kube-system",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Secret",
                "name": holder.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""),
                "uid": holder.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or(""),
                "blockOwnerDeletion": true}]},
        "data": data}),
    )
}

#[derive(Debug, clap::Args)]
pub struct UploadCertsArgs {
    #[command(flatten)]
    pub cluster: crate::token::TokenArgs,
    /// The control-plane PKI directory holding ca.crt, ca.key and sa.key.
    #[arg(long)]
    pub pki: PathBuf,
    /// Encrypt with this key (64 hex digits) instead of a new random one.
    #[arg(long)]
    pub certificate_key: Option<String>,
    /// How long the uploaded keys stay (they are deleted with their holder token).
    #[arg(long, default_value = "2h", value_parser = crate::flags::parse_duration)]
    pub ttl: Duration,
    /// The etcd client URL joining members add themselves through (default: the one uploaded
    /// before, when it is still there).
    #[arg(long)]
    pub client_url: Option<String>,
}

/// `rkube upload-certs` (kubeadm's `init phase upload-certs --upload-certs`): uploads the
/// control-plane keys again under a certificate key, for `ttl`, so that a member can join
/// after the keys `--init` uploaded have expired. Prints the key.
pub async fn upload_certs(args: UploadCertsArgs) -> Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{Api, PostParams};
    if args.ttl < Duration::from_secs(60) {
        bail!("--ttl must be at least 1m");
    }
    let (client, _) = crate::token::admin_client(&args.cluster).await?;
    let secrets: Api<Secret> = Api::namespaced(client, "kube-system");
    let old = secrets.get_opt(CERTS_SECRET).await?;
    let client_url = match (&args.client_url, &old) {
        (Some(url), _) => url.clone(),
        (None, Some(old)) => old
            .data
            .as_ref()
            .and_then(|d| d.get("etcd-endpoints"))
            .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            .ok_or_else(|| anyhow!("the uploaded keys name no etcd endpoint: give --client-url"))?,
        (None, None) => bail!(
            "no keys are uploaded any more, so their etcd endpoint is unknown: give --client-url https://<a member's client address>"
        ),
    };
    let (key, key_hex) = match &args.certificate_key {
        Some(hex) => (parse_certificate_key(hex)?, hex.to_lowercase()),
        None => new_certificate_key(),
    };
    let holder: Secret = serde_json::from_value(holder_token_secret(args.ttl)?)?;
    let holder = secrets
        .create(&PostParams::default(), &holder)
        .await
        .context("creating the keys' holder token")?;
    let certs = certs_secret(
        &key,
        &args.pki,
        &client_url,
        &serde_json::to_value(&holder)?,
    )?;
    let mut certs: Secret = serde_json::from_value(certs)?;
    match old {
        Some(old) => {
            certs.metadata.resource_version = old.metadata.resource_version;
            secrets
                .replace(CERTS_SECRET, &PostParams::default(), &certs)
                .await
                .context("uploading the keys")?;
        }
        None => {
            secrets
                .create(&PostParams::default(), &certs)
                .await
                .context("uploading the keys")?;
        }
    }
    println!(
        "[upload-certs] Storing the certificates in Secret \"{CERTS_SECRET}\" in the \"kube-system\" Namespace\n         [upload-certs] Using certificate key:\n{key_hex}\n         (valid for {}; join with `rkube server --join ... --certificate-key {key_hex}`)",
        if args.ttl.as_secs().is_multiple_of(3600) {
            format!("{}h", args.ttl.as_secs() / 3600)
        } else {
            format!("{}m", args.ttl.as_secs() / 60)
        }
    );
    Ok(())
}

/// `--init`, once the server runs: a bootstrap token, the encrypted keys, the join commands.
pub async fn finish_init(client: rkube_api::client::LocalClient, plan: InitPlan) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let token = format!("{}.{}", crate::token::random(6), crate::token::random(16));
    let secret = crate::token::token_secret(
        &token,
        Duration::from_secs(24 * 3600),
        "signing,authentication",
        "system:bootstrappers:kubeadm:default-node-token",
        "rkube server --init",
    )?;
    loop {
        match client
            .create("/api/v1/namespaces/kube-system/secrets", &secret)
            .await
        {
            Ok(_) => break,
            Err(e) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "creating the first bootstrap token; retrying");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(anyhow!("creating the first bootstrap token: {e}")),
        }
    }
    // The keys, encrypted, owned by a short-lived token so that they go when it expires.
    let (key, key_hex) = new_certificate_key();
    let holder = client
        .create(
            "/api/v1/namespaces/kube-system/secrets",
            &holder_token_secret(CERTS_TTL)?,
        )
        .await
        .map_err(|e| anyhow!("creating the keys' holder token: {e}"))?;
    let certs = certs_secret(&key, &plan.pki, &plan.client_url, &holder)?;
    let path = format!("/api/v1/namespaces/kube-system/secrets/{CERTS_SECRET}");
    match client.get(&path).await {
        Ok(mut old) => {
            old["data"] = certs["data"].clone();
            old["metadata"]["ownerReferences"] = certs["metadata"]["ownerReferences"].clone();
            client
                .update(&path, &old)
                .await
                .map_err(|e| anyhow!("uploading the keys: {e}"))?;
        }
        Err(_) => {
            client
                .create("/api/v1/namespaces/kube-system/secrets", &certs)
                .await
                .map_err(|e| anyhow!("uploading the keys: {e}"))?;
        }
    }
    let pin = pki::ca_spki_sha256(&std::fs::read(plan.pki.join(pki::CA_CERT_FILE))?)?;
    if let Some(path) = &plan.join_file {
        let file = JoinFile {
            server: plan.api_url.clone(),
            token: token.clone(),
            discovery_token_ca_cert_hash: pin.clone(),
            certificate_key: key_hex.clone(),
        };
        pki::write_private(path, &serde_json::to_vec_pretty(&file)?, "join file")?;
    }
    println!(
        "\nYour rkube control plane has initialized successfully!\n\n\
         To use kubectl:\n\n  export KUBECONFIG={}\n\n\
         To add a control-plane member (run on its host, with its own --name, --data-dir, --pki\n\
         and --listen-* addresses; the certificate key expires in 2 hours):\n\n  \
         rkube server --join {api} --token {token} \\\n    --discovery-token-ca-cert-hash {pin} \\\n    --certificate-key {key_hex} ...\n\n\
         To add a worker node:\n\n  \
         rkube agent --server {api} --token {token} \\\n    --discovery-token-ca-cert-hash {pin} --dir <dir>\n",
        plan.kubeconfig.display(),
        api = plan.api_url,
    );
    Ok(())
}

pub struct JoinPlan {
    pub initial_cluster: String,
    pub member_id: u64,
    pub target: crate::client::Target,
}

/// `--join`, before the server starts: discovery, the keys, own certificates, and the
/// learner's MemberAdd.
pub async fn prepare_join(
    join: &str,
    token: &str,
    pin: &str,
    certificate_key: &str,
    m: &Member<'_>,
) -> Result<JoinPlan> {
    let key = parse_certificate_key(certificate_key)?;
    let (_, ca_pem) =
        rkube_agent::join::discover_any(&[join.to_string()], token, pin, DISCOVERY_TIMEOUT)
            .await
            .map_err(|e| anyhow!("discovery at {join}: {e:#}"))?;
    let client = rkube_agent::join::token_client(join, &ca_pem, token).await?;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client, "kube-system");
    // Right after --init the policy that lets tokens read them may be a moment behind.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let certs = loop {
        match secrets.get(CERTS_SECRET).await {
            Ok(c) => break c,
            Err(kube::Error::Api(e))
                if (e.code == 403 || e.code == 404) && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => bail!(
                "reading the uploaded control-plane keys: {} (they expire 2 hours after `rkube server --init`)",
                rkube_agent::join::describe(&e)
            ),
        }
    };
    let data = certs.data.unwrap_or_default();
    let get = |k: &str| -> Result<Vec<u8>> {
        Ok(data
            .get(k)
            .ok_or_else(|| anyhow!("the uploaded keys lack {k}"))?
            .0
            .clone())
    };
    std::fs::create_dir_all(m.pki)?;
    let ca_cert = get(pki::CA_CERT_FILE)?;
    if pki::ca_spki_sha256(&ca_cert)? != pki::ca_spki_sha256(ca_pem.as_bytes())? {
        bail!("the uploaded CA is not the cluster-info CA");
    }
    for f in ENCRYPTED {
        let sealed = String::from_utf8(get(f)?)?;
        let plain = open(&key, &sealed)?;
        pki::write_private(&m.pki.join(f), &plain, "control-plane key")?;
    }
    std::fs::write(m.pki.join(pki::CA_CERT_FILE), &ca_cert)?;
    m.issue_certificates()?;
    write_admin_kubeconfig(m.pki, &m.api_url()?)?;
    let endpoints = String::from_utf8(get("etcd-endpoints")?)?;
    let target = crate::client::ClusterArgs {
        endpoints: Some(endpoints),
        cacert: Some(m.pki.join(pki::CA_CERT_FILE)),
        cert: Some(m.pki.join("admin.crt")),
        key: Some(m.pki.join("admin.key")),
        dir: None,
        insecure: false,
    }
    .resolve()?;
    let ch = target.connect().await?;
    let mut cluster = pb::cluster_client::ClusterClient::new(ch);
    let peer_url = format!("https://{}", m.listen_peer);
    let list = cluster
        .member_list(pb::MemberListRequest { linearizable: true })
        .await?
        .into_inner();
    let existing = list
        .members
        .iter()
        .find(|x| x.name == m.name || x.peer_ur_ls.contains(&peer_url));
    let (id, members) = match existing {
        // Added before (a join that stopped half-way): go on with it.
        Some(m) => (m.id, list.members.clone()),
        None => {
            let added = cluster
                .member_add(pb::MemberAddRequest {
                    peer_ur_ls: vec![peer_url.clone()],
                    is_learner: true,
                })
                .await
                .context("adding this member as a learner")?
                .into_inner();
            (added.member.map(|m| m.id).unwrap_or(0), added.members)
        }
    };
    let initial_cluster = crate::member::initial_cluster(&members, id, m.name);
    Ok(JoinPlan {
        initial_cluster,
        member_id: id,
        target,
    })
}

/// The joined learner promotes itself once the cluster accepts it as caught up.
pub async fn promote_when_ready(plan: JoinPlan) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Ok(ch) = plan.target.connect().await else {
            continue;
        };
        let mut cluster = pb::cluster_client::ClusterClient::new(ch);
        match cluster
            .member_promote(pb::MemberPromoteRequest { id: plan.member_id })
            .await
        {
            Ok(_) => {
                tracing::info!(
                    id = format!("{:x}", plan.member_id),
                    "promoted to a voting member"
                );
                println!("This member has joined the control plane as a voting member.");
                return;
            }
            Err(s)
                if s.message().contains("not a learner") || s.message().contains("not found") =>
            {
                return;
            }
            Err(s) => tracing::debug!(error = %s.message(), "not promoted yet"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_keys_open_only_with_their_key() {
        let key: [u8; 32] = rand::random();
        let sealed = seal(&key, b"-----BEGIN PRIVATE KEY-----").unwrap();
        assert_eq!(open(&key, &sealed).unwrap(), b"-----BEGIN PRIVATE KEY-----");
        let other: [u8; 32] = rand::random();
        assert!(open(&other, &sealed).is_err());
        let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(parse_certificate_key(&hex).unwrap(), key);
        assert!(parse_certificate_key("abc").is_err());
    }
}
