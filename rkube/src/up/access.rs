//! What `up` writes into DIR so that the members and their clients can reach each other: the
//! certificates (`pki/`), the admin's kubeconfig and the `env` file.

use std::path::Path;

use anyhow::{Context, Result};

use super::layout::LocalCluster;

pub(super) fn write_pki(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    use rkube_pki as pki;
    let pki_dir = dir.join("pki");
    pki::init_ca(&pki_dir)?;
    pki::init_service_account_key(&pki_dir)?;
    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string()];
    // Pods reach the API through the `kubernetes` Service (the servers' default range and
    // cluster domain).
    sans.extend(rkube_api::services::ServiceNet::default().api_sans("cluster.local"));
    if let Some(net) = &cluster.network {
        sans.push(net.host_ip());
    }
    for m in &cluster.members {
        let mut sans = sans.clone();
        sans.push(m.name.clone());
        pki::issue(&pki_dir, &m.name, &m.name, None, &sans, true, true)?;
    }
    pki::issue(
        &pki_dir,
        "admin",
        "kubernetes-admin",
        Some("system:masters"),
        &[],
        false,
        true,
    )?;
    pki::issue_kubelet_client(&pki_dir)?;
    Ok(())
}

pub(super) fn write_env(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    let abs = std::fs::canonicalize(dir)?;
    let pki = abs.join("pki");
    let mut env = format!(
        "export ETCDCTL_API=3\nexport ETCDCTL_ENDPOINTS={}\nexport ETCDCTL_CACERT={}\nexport ETCDCTL_CERT={}\nexport ETCDCTL_KEY={}\n",
        match &cluster.endpoint {
            Some(e) => format!("https://{}", e.client),
            None => cluster.client_urls().join(","),
        },
        pki.join("ca.crt").display(),
        pki.join("admin.crt").display(),
        pki.join("admin.key").display(),
    );
    if !cluster.store_only {
        env.push_str(&format!(
            "export KUBECONFIG={}\n",
            abs.join(KUBECONFIG_FILE).display()
        ));
    }
    std::fs::write(dir.join("env"), env)?;
    Ok(())
}

pub const KUBECONFIG_FILE: &str = "admin.kubeconfig";

/// DIR/admin.kubeconfig: the admin's certificate, the control-plane endpoint's context
/// (`rkube`, current) and one context per server (`rkube-n1`...). Written once: later changes (`kubectl config set-context`) are the
/// user's.
pub(super) fn write_kubeconfig(dir: &Path, cluster: &LocalCluster) -> Result<()> {
    use base64::Engine;
    let path = dir.join(KUBECONFIG_FILE);
    if path.exists() {
        return Ok(());
    }
    let b64 = |f: &str| -> Result<String> {
        let bytes =
            std::fs::read(dir.join("pki").join(f)).with_context(|| format!("reading pki/{f}"))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    };
    let (ca, cert, key) = (b64("ca.crt")?, b64("admin.crt")?, b64("admin.key")?);
    let mut clusters = String::new();
    let mut contexts = String::new();
    let endpoint = cluster.endpoint.as_ref().and_then(|e| e.api.as_deref());
    if let Some(api) = endpoint {
        clusters.push_str(&format!(
            "- name: rkube\n  cluster:\n    server: https://{api}\n    certificate-authority-data: {ca}\n"
        ));
        contexts.push_str(
            "- name: rkube\n  context:\n    cluster: rkube\n    user: kubernetes-admin\n",
        );
    }
    for m in &cluster.members {
        clusters.push_str(&format!(
            "- name: rkube-{name}\n  cluster:\n    server: https://{addr}\n    certificate-authority-data: {ca}\n",
            name = m.name,
            addr = m.api_addr(),
        ));
        contexts.push_str(&format!(
            "- name: rkube-{name}\n  context:\n    cluster: rkube-{name}\n    user: kubernetes-admin\n",
            name = m.name,
        ));
    }
    let current = match endpoint {
        Some(_) => "rkube".to_string(),
        None => format!(
            "rkube-{}",
            cluster
                .members
                .first()
                .map(|m| m.name.as_str())
                .unwrap_or("n1")
        ),
    };
    let doc = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n{clusters}contexts:\n{contexts}current-context: {current}\nusers:\n- name: kubernetes-admin\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\npreferences: {{}}\n"
    );
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(doc.as_bytes())?;
    Ok(())
}
