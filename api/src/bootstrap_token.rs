//! Authentication with a bootstrap token (the format and the signing of `cluster-info` are
//! `rkube_core::bootstrap_token`'s): a valid token authenticates as `system:bootstrap:<id>` in
//! the group `system:bootstrappers` and the token's `auth-extra-groups`.

use k8s_openapi::api::core::v1::Secret;

use rkube_core::bootstrap_token::{
    constant_time_eq, expired, secret_value, GROUP, SECRET_TYPE, USER_PREFIX,
};

use crate::auth::User;

/// Why a stored token does not authenticate, or the user it authenticates as.
pub fn check(
    secret: &Secret,
    id: &str,
    presented: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<User, &'static str> {
    if secret.type_.as_deref() != Some(SECRET_TYPE) {
        return Err("the secret is not a bootstrap token");
    }
    if secret.metadata.deletion_timestamp.is_some() {
        return Err("the token is being deleted");
    }
    if secret_value(secret, "token-id").as_deref() != Some(id) {
        return Err("the secret's token-id does not match its name");
    }
    let stored = secret_value(secret, "token-secret").unwrap_or_default();
    if !constant_time_eq(stored.as_bytes(), presented.as_bytes()) {
        return Err("the token's secret does not match");
    }
    if secret_value(secret, "usage-bootstrap-authentication").as_deref() != Some("true") {
        return Err("the token may not be used for authentication");
    }
    if expired(secret, now) {
        return Err("the token has expired");
    }
    let mut groups = vec![GROUP.to_string()];
    for g in secret_value(secret, "auth-extra-groups")
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
    {
        // Kubernetes accepts only extra groups under system:bootstrappers:.
        if g.starts_with("system:bootstrappers:") && !groups.iter().any(|x| x == g) {
            groups.push(g.to_string());
        }
    }
    groups.push("system:authenticated".into());
    Ok(User {
        name: format!("{USER_PREFIX}{id}"),
        groups,
        ..User::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde_json::{json, Value};

    fn b64(s: &str) -> String {
        STANDARD.encode(s)
    }

    fn secret(extra: &[(&str, &str)]) -> Secret {
        let mut data = serde_json::Map::new();
        for (k, v) in [
            ("token-id", "abcdef"),
            ("token-secret", "0123456789abcdef"),
            ("usage-bootstrap-authentication", "true"),
        ]
        .iter()
        .chain(extra)
        {
            data.insert(k.to_string(), json!(b64(v)));
        }
        let v: Value = json!({"type": SECRET_TYPE, "metadata": {"name": "bootstrap-token-abcdef"},
                             "data": data});
        serde_json::from_value(v).expect("a Secret")
    }

    #[test]
    fn a_valid_token_is_a_bootstrapper_with_its_extra_groups() {
        let now = chrono::Utc::now();
        let s = secret(&[(
            "auth-extra-groups",
            "system:bootstrappers:kubeadm:default-node-token,evil",
        )]);
        let u = check(&s, "abcdef", "0123456789abcdef", now).unwrap();
        assert_eq!(u.name, "system:bootstrap:abcdef");
        assert_eq!(
            u.groups,
            vec![
                "system:bootstrappers",
                "system:bootstrappers:kubeadm:default-node-token",
                "system:authenticated"
            ]
        );
        assert!(check(&s, "abcdef", "0123456789abcdeX", now).is_err());
    }

    #[test]
    fn expired_or_non_authentication_tokens_are_refused() {
        let now = chrono::Utc::now();
        let past = (now - chrono::Duration::seconds(1)).to_rfc3339();
        let future = (now + chrono::Duration::hours(1)).to_rfc3339();
        assert_eq!(
            check(
                &secret(&[("expiration", &past)]),
                "abcdef",
                "0123456789abcdef",
                now
            )
            .unwrap_err(),
            "the token has expired"
        );
        assert!(check(
            &secret(&[("expiration", &future)]),
            "abcdef",
            "0123456789abcdef",
            now
        )
        .is_ok());
        let mut s = secret(&[]);
        if let Some(data) = s.data.as_mut() {
            data.insert(
                "usage-bootstrap-authentication".into(),
                k8s_openapi::ByteString(b"false".to_vec()),
            );
        }
        assert!(check(&s, "abcdef", "0123456789abcdef", now).is_err());
    }
}
