//! Bootstrap tokens, as kubeadm uses them to join nodes: `<id>.<secret>` with id `[a-z0-9]{6}`
//! and secret `[a-z0-9]{16}`, kept as the Secret `kube-system/bootstrap-token-<id>` of type
//! `bootstrap.kubernetes.io/token`. A token whose secret allows signing also signs the
//! `cluster-info` ConfigMap (a detached JWS, HS256 keyed by the token), so a joining node can
//! check that the server it reached knows the token. Authenticating with one is the API's
//! (`rkube_api::bootstrap_token::check`).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use sha2::{Digest, Sha256};

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const SECRET_PREFIX: &str = "bootstrap-token-";
pub const GROUP: &str = "system:bootstrappers";
pub const USER_PREFIX: &str = "system:bootstrap:";

/// The token's two halves when `token` has the bootstrap token format.
pub fn parse(token: &str) -> Option<(&str, &str)> {
    let (id, secret) = token.split_once('.')?;
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    (ok(id, 6) && ok(secret, 16)).then_some((id, secret))
}

/// A Secret's `data` or `stringData` value for `key`, as text.
pub fn secret_value(secret: &Secret, key: &str) -> Option<String> {
    if let Some(v) = secret.data.as_ref().and_then(|d| d.get(key)) {
        return String::from_utf8(v.0.clone()).ok();
    }
    secret.string_data.as_ref()?.get(key).cloned()
}

/// Whether the token's `expiration` (RFC 3339) has passed. A token without one never expires;
/// one whose expiration cannot be read counts as expired.
pub fn expired(secret: &Secret, now: chrono::DateTime<chrono::Utc>) -> bool {
    match secret_value(secret, "expiration") {
        None => false,
        Some(s) => match chrono::DateTime::parse_from_rfc3339(s.trim()) {
            Ok(t) => t.with_timezone(&chrono::Utc) <= now,
            Err(_) => true,
        },
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The detached JWS (`<header>..<signature>`) of `payload` that kubeadm's bootstrap signer puts
/// in `cluster-info` as `jws-kubeconfig-<id>`: HS256 keyed by the whole token, `kid` the id.
pub fn detached_jws(payload: &str, id: &str, secret: &str) -> String {
    let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"HS256","kid":"{id}"}}"#));
    let signing_input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(payload));
    let sig = hmac_sha256(
        format!("{id}.{secret}").as_bytes(),
        signing_input.as_bytes(),
    );
    format!("{header}..{}", URL_SAFE_NO_PAD.encode(sig))
}

/// Whether `jws` is the detached signature of `payload` by the token `id.secret`.
pub fn verify_detached_jws(jws: &str, payload: &str, id: &str, secret: &str) -> bool {
    constant_time_eq(detached_jws(payload, id, secret).as_bytes(), jws.as_bytes())
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_six_dot_sixteen_lowercase_alphanumerics() {
        assert_eq!(
            parse("abcdef.0123456789abcdef"),
            Some(("abcdef", "0123456789abcdef"))
        );
        assert_eq!(parse("ABCDEF.0123456789abcdef"), None);
        assert_eq!(parse("abcde.0123456789abcdef"), None);
        assert_eq!(parse("abcdef.0123456789abcde"), None);
        assert_eq!(parse("eyJhbGciOi.x"), None);
    }

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn a_detached_jws_verifies_only_with_its_token_and_payload() {
        let jws = detached_jws("payload", "abcdef", "0123456789abcdef");
        assert!(jws.contains(".."));
        assert!(verify_detached_jws(
            &jws,
            "payload",
            "abcdef",
            "0123456789abcdef"
        ));
        assert!(!verify_detached_jws(
            &jws,
            "payload2",
            "abcdef",
            "0123456789abcdef"
        ));
        assert!(!verify_detached_jws(
            &jws,
            "payload",
            "abcdef",
            "0123456789abcdeg"
        ));
    }

    #[test]
    fn values_come_from_data_or_string_data_and_expiry_from_expiration() {
        use k8s_openapi::ByteString;
        let now = chrono::Utc::now();
        let past = (now - chrono::Duration::seconds(1)).to_rfc3339();
        let secret = |data: &[(&str, &str)], string_data: &[(&str, &str)]| Secret {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            string_data: Some(
                string_data
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Secret::default()
        };
        let s = secret(
            &[("token-id", "abcdef")],
            &[("token-id", "other"), ("x", "y")],
        );
        assert_eq!(secret_value(&s, "token-id").as_deref(), Some("abcdef"));
        assert_eq!(secret_value(&s, "x").as_deref(), Some("y"));
        assert_eq!(secret_value(&s, "missing"), None);
        assert!(!expired(&s, now), "no expiration: never");
        assert!(expired(&secret(&[("expiration", &past)], &[]), now));
        assert!(expired(&secret(&[("expiration", "soon")], &[]), now));
    }
}
