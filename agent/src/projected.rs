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
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use rkube_core::json::str_at as s;
use serde_json::Value;

/// The symlink to the current files.
const DATA: &str = "..data";
/// The part of a token's lifetime after which it is renewed (the kubelet's 80%).
const RENEW_AFTER: f64 = 0.8;
/// The longest a token is kept, whatever its lifetime (the kubelet's 24 hours).
const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// One file of the volume: its path under the volume, content and mode.
type Files = BTreeMap<String, (Vec<u8>, u32)>;

fn items(v: &Value, p: &str) -> Vec<Value> {
    v.pointer(p)
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

fn mode(v: &Value, default: u32) -> u32 {
    v.get("mode")
        .and_then(Value::as_u64)
        .map(|m| m as u32)
        .unwrap_or(default)
}

/// Adds a ConfigMap's or Secret's keys (all, or the items named) to `files`.
async fn object_files(
    client: &kube::Client,
    pod: &Value,
    kind: &str,
    source: &Value,
    default_mode: u32,
    files: &mut Files,
) -> Result<()> {
    let ns = s(pod, "/metadata/namespace");
    let name = s(source, "/name");
    let optional = source
        .get("optional")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let data = match crate::podspec::object_data(client, ns, kind, name).await {
        Ok(d) => d,
        Err(_) if optional => return Ok(()),
        Err(e) => return Err(e),
    };
    let listed = items(source, "/items");
    if listed.is_empty() {
        for (k, v) in data {
            files.insert(k, (v, default_mode));
        }
        return Ok(());
    }
    for item in listed {
        let key = s(&item, "/key");
        match data.get(key) {
            Some(bytes) => {
                files.insert(
                    s(&item, "/path").to_string(),
                    (bytes.clone(), mode(&item, default_mode)),
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

/// A bound token for the pod's ServiceAccount, as the TokenRequest API answers it: the token
/// and its lifetime in seconds.
async fn request_token(client: &kube::Client, pod: &Value, source: &Value) -> Result<String> {
    let ns = s(pod, "/metadata/namespace");
    let sa = match s(pod, "/spec/serviceAccountName") {
        "" => "default",
        name => name,
    };
    let audience = s(source, "/audience");
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: if audience.is_empty() {
                Vec::new()
            } else {
                vec![audience.to_string()]
            },
            expiration_seconds: source.get("expirationSeconds").and_then(Value::as_i64),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(s(pod, "/metadata/name").to_string()),
                uid: Some(s(pod, "/metadata/uid").to_string()),
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
pub async fn files(client: &kube::Client, pod: &Value, projected: &Value) -> Result<Files> {
    let default_mode = projected
        .get("defaultMode")
        .and_then(Value::as_u64)
        .map(|m| m as u32)
        .unwrap_or(0o644);
    let mut files = Files::new();
    for source in items(projected, "/sources") {
        if let Some(token) = source.get("serviceAccountToken") {
            let t = request_token(client, pod, token).await?;
            files.insert(
                s(token, "/path").to_string(),
                (t.into_bytes(), default_mode),
            );
        } else if let Some(cm) = source.get("configMap") {
            object_files(client, pod, "configMap", cm, default_mode, &mut files).await?;
        } else if let Some(secret) = source.get("secret") {
            object_files(client, pod, "secret", secret, default_mode, &mut files).await?;
        } else if let Some(d) = source.get("downwardAPI") {
            for item in items(d, "/items") {
                let value = match item.pointer("/fieldRef/fieldPath").and_then(Value::as_str) {
                    Some(path) => crate::podspec::field(pod, path, "")?,
                    None => bail!(
                        "downwardAPI item {:?}: only fieldRef is supported by this agent yet",
                        s(&item, "/path")
                    ),
                };
                files.insert(
                    s(&item, "/path").to_string(),
                    (value.into_bytes(), mode(&item, default_mode)),
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

/// Fills in the projected volume `volume` of `pod` at `dir`.
pub async fn project(client: &kube::Client, pod: &Value, volume: &Value, dir: &Path) -> Result<()> {
    let projected = volume
        .get("projected")
        .ok_or_else(|| anyhow!("not a projected volume"))?;
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
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    Some((claims.get("iat")?.as_i64()?, claims.get("exp")?.as_i64()?))
}

/// The projected volumes of `pod` holding a token, with their directories under `root`.
fn token_volumes<'a>(pod: &'a Value, root: &Path) -> Vec<(&'a Value, PathBuf, Vec<String>)> {
    let base = root.join(s(pod, "/metadata/uid")).join("volumes");
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let paths: Vec<String> = v
                .pointer("/projected/sources")
                .and_then(Value::as_array)?
                .iter()
                .filter_map(|src| {
                    src.pointer("/serviceAccountToken/path")
                        .and_then(Value::as_str)
                })
                .map(str::to_string)
                .collect();
            (!paths.is_empty()).then(|| (v, base.join(s(v, "/name")), paths))
        })
        .collect()
}

/// Renews the tokens of the pod's projected volumes that are due (volumes not made yet are
/// left to the container's start). A failure keeps the current files and is tried again at
/// the next call.
pub async fn renew_due(client: &kube::Client, pod: &Value, root: &Path, now: SystemTime) {
    for (volume, dir, paths) in token_volumes(pod, root) {
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
        match project(client, pod, volume, &dir).await {
            Ok(()) => tracing::info!(
                pod = s(pod, "/metadata/name"),
                volume = s(volume, "/name"),
                "renewed the service account token"
            ),
            Err(e) => tracing::warn!(pod = s(pod, "/metadata/name"), volume = s(volume, "/name"),
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
