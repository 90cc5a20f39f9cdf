//! Projected volumes, as the kubelet fills them in: service account tokens (a TokenRequest for
//! the pod's ServiceAccount, bound to the pod), keys of ConfigMaps and Secrets, and downward API
//! fields, written together into one directory that containers mount.
//!
//! The directory is written as the kubelet's atomic writer does: the files go into a new
//! hidden directory `..<timestamp>`, the symlink `..data` is swapped to it with one rename, and
//! each visible name is a symlink through `..data`. A container reading the mount sees either
//! the old files or the new ones, never a mix, and the directory itself (what the container
//! runtime bind-mounts) never changes.
//!
//! A token is renewed once 80% of its lifetime has passed, as the kubelet's token manager does.
//! Its lifetime is read from the token itself (its `iat` and `exp` claims), so an agent that
//! restarts renews the tokens of the pods it adopts on time.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    KeyToPath, Pod, ProjectedVolumeSource, ServiceAccount, ServiceAccountTokenProjection,
};
use kube::api::{Api, PostParams};
use rkube_core::meta;

use crate::podspec::{pod_volumes, spec_str};

/// The symlink to the current files.
const DATA: &str = "..data";
/// The part of a token's lifetime after which it is renewed (the kubelet's 80%).
const RENEW_AFTER: f64 = 0.8;
/// The longest a token is kept, whatever its lifetime (the kubelet's 24 hours).
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// One file of the volume: its path under the volume, content and mode.
type Files = BTreeMap<String, (Vec<u8>, u32)>;

fn mode(mode: Option<i32>, default: u32) -> u32 {
    mode.map(|m| m as u32).unwrap_or(default)
}

/// Adds a ConfigMap's or Secret's keys (all, or the `listed` ones) to `files`.
async fn object_files(
    client: &kube::Client,
    pod: &Pod,
    kind: &str,
    (name, optional, listed): (&str, Option<bool>, &[KeyToPath]),
    default_mode: u32,
    files: &mut Files,
) -> Result<()> {
    let ns = meta::namespace(&pod.metadata);
    let optional = optional.unwrap_or(false);
    let data = match crate::podspec::object_data(client, ns, kind, name).await {
        Ok(d) => d,
        Err(_) if optional => return Ok(()),
        Err(e) => return Err(e),
    };
    if listed.is_empty() {
        for (k, v) in data {
            files.insert(k, (v, default_mode));
        }
        return Ok(());
    }
    for item in listed {
        let key = item.key.as_str();
        match data.get(key) {
            Some(bytes) => {
                files.insert(
                    item.path.clone(),
                    (bytes.clone(), mode(item.mode, default_mode)),
                );
            }
            None if optional => {}
            // The kubelet's words.
            None if kind == "configMap" => {
                bail!("configmap references non-existent config key: {key}")
            }
            None => bail!("references non-existent secret key: {key}"),
        }
    }
    Ok(())
}

/// A bound token for the pod's ServiceAccount, as the TokenRequest API answers it.
async fn request_token(
    client: &kube::Client,
    pod: &Pod,
    source: &ServiceAccountTokenProjection,
) -> Result<String> {
    let ns = meta::namespace(&pod.metadata);
    let sa = match spec_str(pod, |s| s.service_account_name.as_ref()) {
        "" => "default",
        name => name,
    };
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: source
                .audience
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            expiration_seconds: source.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(meta::name(&pod.metadata).to_string()),
                uid: Some(meta::uid(&pod.metadata).to_string()),
            }),
        },
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .map_err(|e| anyhow!("failed to fetch token: {}", crate::join::describe(&e)))?;
    answer
        .status
        .map(|st| st.token)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("failed to fetch token: the API answered no token"))
}

/// Everything the volume holds, read afresh.
pub async fn files(
    client: &kube::Client,
    pod: &Pod,
    projected: &ProjectedVolumeSource,
) -> Result<Files> {
    let default_mode = mode(projected.default_mode, 0o644);
    let mut files = Files::new();
    for source in projected.sources.iter().flatten() {
        let keys = source
            .config_map
            .as_ref()
            .map(|c| {
                (
                    "configMap",
                    (c.name.as_str(), c.optional, c.items.as_deref()),
                )
            })
            .or_else(|| {
                let s = source.secret.as_ref()?;
                Some(("secret", (s.name.as_str(), s.optional, s.items.as_deref())))
            });
        if let Some(token) = &source.service_account_token {
            let t = request_token(client, pod, token).await?;
            files.insert(token.path.clone(), (t.into_bytes(), default_mode));
        } else if let Some((kind, (name, optional, items))) = keys {
            let what = (name, optional, items.unwrap_or_default());
            object_files(client, pod, kind, what, default_mode, &mut files).await?;
        } else if let Some(d) = &source.downward_api {
            for item in d.items.iter().flatten() {
                let value = match &item.field_ref {
                    Some(f) => crate::podspec::field(pod, &f.field_path, "")?,
                    None => bail!(
                        "downwardAPI item {:?}: only fieldRef is supported by this agent yet",
                        item.path
                    ),
                };
                files.insert(
                    item.path.clone(),
                    (value.into_bytes(), mode(item.mode, default_mode)),
                );
            }
        } else {
            bail!("a projected volume source of this kind is not supported by this agent yet");
        }
    }
    Ok(files)
}

/// Writes `files` into `dir` as the kubelet's atomic writer does (see the module notes).
pub fn write_atomically(dir: &Path, files: &Files) -> Result<()> {
    for rel in files.keys() {
        let bad = rel.is_empty()
            || rel.starts_with('/')
            || rel.split('/').any(|p| p == ".." || p.starts_with(".."));
        if bad {
            bail!("{rel:?}: must be a relative path and may not contain '..'");
        }
    }
    std::fs::create_dir_all(dir)?;
    let stamp = chrono::Utc::now()
        .format("..%Y_%m_%d_%H_%M_%S.%f")
        .to_string();
    let fresh = dir.join(format!("{stamp}{}", crate::podspec::random_suffix()));
    std::fs::create_dir(&fresh)?;
    for (rel, (bytes, mode)) in files {
        let file = fresh.join(rel);
        if let Some(parent) = file.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&file, bytes)?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(*mode))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    let target = fresh
        .file_name()
        .ok_or_else(|| anyhow!("a timestamped directory has a name"))?;
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA)).context("swapping ..data")?;
    // The visible names: a symlink through ..data for each top-level name.
    let top: std::collections::BTreeSet<&str> = files
        .keys()
        .filter_map(|rel| rel.split('/').next())
        .collect();
    for name in &top {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA).join(name), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let stale_link = !name.starts_with("..") && !top.contains(name.as_str());
        // Earlier timestamped directories (the one ..data named, and any a crash left).
        let stale_dir = name.starts_with("..") && name != DATA && Path::new(&name) != target;
        if stale_link {
            let _ = std::fs::remove_file(entry.path());
        } else if stale_dir && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    Ok(())
}

/// Fills in the projected volume `projected` of `pod` at `dir`.
pub async fn project(
    client: &kube::Client,
    pod: &Pod,
    projected: &ProjectedVolumeSource,
    dir: &Path,
) -> Result<()> {
    let files = files(client, pod, projected).await?;
    write_atomically(dir, &files)
}

/// When a token issued at `iat` that expires at `exp` (seconds since the epoch) is renewed:
/// after 80% of its lifetime, and at most 24 hours after it was issued.
pub fn renew_at(iat: i64, exp: i64) -> SystemTime {
    let life = (exp - iat).max(0) as f64;
    let after = Duration::from_secs_f64(life * RENEW_AFTER).min(MAX_AGE);
    UNIX_EPOCH + Duration::from_secs(iat.max(0) as u64) + after
}

/// The `iat` and `exp` claims of a JSON Web Token (read, not verified: the agent only needs to
/// know when to ask for the next one).
pub fn token_times(token: &str) -> Option<(i64, i64)> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    /// The two claims read; the others are ignored.
    #[derive(serde::Deserialize)]
    struct Times {
        iat: i64,
        exp: i64,
    }
    let claims: Times = serde_json::from_slice(&bytes).ok()?;
    Some((claims.iat, claims.exp))
}

/// The projected volumes of `pod` holding a token: the volume's name and source, its
/// directory under `root` and the tokens' paths in it.
fn token_volumes<'a>(
    pod: &'a Pod,
    root: &Path,
) -> Vec<(&'a str, &'a ProjectedVolumeSource, PathBuf, Vec<&'a str>)> {
    let base = root.join(meta::uid(&pod.metadata)).join("volumes");
    pod_volumes(pod)
        .filter_map(|v| {
            let projected = v.projected.as_ref()?;
            let paths: Vec<&str> = projected
                .sources
                .iter()
                .flatten()
                .filter_map(|src| src.service_account_token.as_ref())
                .map(|t| t.path.as_str())
                .collect();
            (!paths.is_empty()).then(|| (v.name.as_str(), projected, base.join(&v.name), paths))
        })
        .collect()
}

/// Renews the tokens of the pod's projected volumes that are due (volumes not made yet are
/// left to the container's start). A failure keeps the current files and is tried again at
/// the next call.
pub async fn renew_due(client: &kube::Client, pod: &Pod, root: &Path, now: SystemTime) {
    let pod_name = meta::name(&pod.metadata);
    for (volume, projected, dir, paths) in token_volumes(pod, root) {
        if std::fs::symlink_metadata(dir.join(DATA)).is_err() {
            continue;
        }
        let due = paths.iter().any(|p| {
            std::fs::read_to_string(dir.join(DATA).join(p))
                .ok()
                .and_then(|t| token_times(t.trim()))
                .is_none_or(|(iat, exp)| now >= renew_at(iat, exp))
        });
        if !due {
            continue;
        }
        match project(client, pod, projected, &dir).await {
            Ok(()) => tracing::info!(pod = pod_name, volume, "renewed the service account token"),
            Err(e) => tracing::warn!(pod = pod_name, volume,
                error = %format!("{e:#}"), "renewing the service account token failed; keeping the current one"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(pairs: &[(&str, &str)]) -> Files {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), (v.as_bytes().to_vec(), 0o644)))
            .collect()
    }

    #[test]
    fn tokens_are_renewed_after_80_percent_of_their_life_and_within_a_day() {
        // (iat, exp, renewed at)
        let cases = [
            (1_000, 1_000 + 3607, 1_000 + 2885),
            (0, 600, 480),
            (0, 10 * 24 * 3600, 24 * 3600),
            (50, 40, 50),
        ];
        for (iat, exp, want) in cases {
            let got = renew_at(iat, exp)
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs_f64();
            assert!((got - want as f64).abs() < 1.0, "{iat} {exp}: {got}");
        }
    }

    #[test]
    fn token_times_come_from_the_claims() {
        let b64 = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v);
        let token = format!(
            "{}.{}.sig",
            b64(r#"{"alg":"ES256"}"#),
            b64(r#"{"iat":100,"exp":3707,"sub":"system:serviceaccount:a:b"}"#)
        );
        assert_eq!(token_times(&token), Some((100, 3707)));
        for junk in ["", "a.b.c", "x", "a.e30.c"] {
            assert_eq!(token_times(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn the_data_link_swaps_to_the_new_files_and_the_old_go() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("kube-api-access-abcde");
        write_atomically(
            &vol,
            &files(&[("token", "one"), ("ca.crt", "ca"), ("namespace", "dev")]),
        )
        .unwrap();
        let first = std::fs::read_link(vol.join(DATA)).unwrap();
        assert_eq!(std::fs::read_to_string(vol.join("token")).unwrap(), "one");
        assert_eq!(
            std::fs::read_link(vol.join("token")).unwrap(),
            Path::new("..data/token")
        );
        let m = std::fs::metadata(vol.join("token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o777, 0o644);
        write_atomically(&vol, &files(&[("token", "two"), ("ca.crt", "ca")])).unwrap();
        let second = std::fs::read_link(vol.join(DATA)).unwrap();
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(vol.join("token")).unwrap(), "two");
        assert!(!vol.join(&first).exists(), "the old files are removed");
        assert!(
            std::fs::symlink_metadata(vol.join("namespace")).is_err(),
            "a name no longer projected goes"
        );
        let hidden: Vec<String> = std::fs::read_dir(&vol)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with(".."))
            .collect();
        assert_eq!(
            hidden.len(),
            2,
            "..data and one timestamped directory: {hidden:?}"
        );
    }

    #[test]
    fn paths_out_of_the_volume_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["../x", "/etc/passwd", "a/../../b", "..data"] {
            assert!(
                write_atomically(dir.path(), &files(&[(bad, "x")])).is_err(),
                "{bad}"
            );
        }
    }
}
