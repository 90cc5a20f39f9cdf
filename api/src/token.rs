//! Service account tokens: JSON Web Tokens signed (ES256) with the cluster's service account key,
//! carrying the claims Kubernetes' bound tokens carry (`sub`
//! `system:serviceaccount:<ns>:<name>`, audiences, expiry, and under `kubernetes.io` the
//! namespace, the service account's name and uid, and the object the token is bound to).
//!
//! [`SigningKey::issue`] answers TokenRequest (`kubectl create token`); [`SigningKey::verify`]
//! checks a bearer token's signature, issuer, audience and lifetime. Whether the service account
//! (and a bound pod or secret) still exists with the same uid is the caller's check, against
//! the store.

use std::collections::BTreeMap;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::auth::User;

/// The issuer, and the audience the API server accepts (kube-apiserver's defaults).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("the service account signing key is not a valid ECDSA P-256 key: {0}")]
    Key(#[source] jsonwebtoken::errors::Error),
    #[error("signing a token failed: {0}")]
    Sign(#[source] jsonwebtoken::errors::Error),
    #[error("invalid bearer token: {0}")]
    Invalid(#[source] jsonwebtoken::errors::Error),
}

/// A reference to the object a token is bound to, or to its service account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    pub namespace: String,
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<ObjectRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub aud: Vec<String>,
    pub exp: i64,
    pub iat: i64,
    pub nbf: i64,
    pub iss: String,
    pub jti: String,
    pub sub: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

impl Claims {
    /// The user a verified token authenticates as.
    pub fn user(&self) -> User {
        let ns = &self.kubernetes.namespace;
        let mut extra = BTreeMap::new();
        extra.insert(
            "authentication.kubernetes.io/credential-id".to_string(),
            vec![format!("JTI={}", self.jti)],
        );
        if let Some(pod) = &self.kubernetes.pod {
            extra.insert(
                "authentication.kubernetes.io/pod-name".to_string(),
                vec![pod.name.clone()],
            );
            extra.insert(
                "authentication.kubernetes.io/pod-uid".to_string(),
                vec![pod.uid.clone()],
            );
        }
        User {
            name: self.sub.clone(),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".to_string(),
            ],
            uid: self.kubernetes.serviceaccount.uid.clone(),
            extra,
        }
    }
}

/// What a token is issued for.
pub struct Grant<'a> {
    pub namespace: &'a str,
    pub service_account: ObjectRef,
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
    /// (kind, reference): a Pod, Secret or Node the token lives and dies with.
    pub bound: Option<(&'a str, ObjectRef)>,
    pub now: i64,
    pub id: String,
}

pub struct SigningKey {
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

impl SigningKey {
    /// From the private key (PKCS#8 PEM) and its public key (SubjectPublicKeyInfo PEM).
    pub fn from_pem(private_pem: &str, public_pem: &str) -> Result<SigningKey, TokenError> {
        Ok(SigningKey {
            encoding: EncodingKey::from_ec_pem(private_pem.as_bytes()).map_err(TokenError::Key)?,
            decoding: DecodingKey::from_ec_pem(public_pem.as_bytes()).map_err(TokenError::Key)?,
        })
    }

    /// Signs a token; returns it with its claims.
    pub fn issue(&self, g: Grant<'_>) -> Result<(String, Claims), TokenError> {
        let mut k = KubernetesClaims {
            namespace: g.namespace.to_string(),
            serviceaccount: g.service_account.clone(),
            pod: None,
            secret: None,
            node: None,
        };
        match g.bound {
            Some(("Pod", r)) => k.pod = Some(r),
            Some(("Secret", r)) => k.secret = Some(r),
            Some(("Node", r)) => k.node = Some(r),
            _ => {}
        }
        let claims = Claims {
            aud: g.audiences,
            exp: g.now + g.expiration_seconds,
            iat: g.now,
            nbf: g.now,
            iss: ISSUER.to_string(),
            jti: g.id,
            sub: format!(
                "system:serviceaccount:{}:{}",
                g.namespace, g.service_account.name
            ),
            kubernetes: k,
        };
        let token = jsonwebtoken::encode(&Header::new(Algorithm::ES256), &claims, &self.encoding)
            .map_err(TokenError::Sign)?;
        Ok((token, claims))
    }

    /// The claims of a token this cluster signed for the API server's audience, if it is
    /// still valid.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let mut v = Validation::new(Algorithm::ES256);
        v.set_audience(&[ISSUER]);
        v.set_issuer(&[ISSUER]);
        v.validate_nbf = true;
        v.leeway = 0;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &v)
            .map(|d| d.claims)
            .map_err(TokenError::Invalid)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn test_key() -> SigningKey {
        // A throwaway P-256 key made for these tests.
        let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        SigningKey::from_pem(&kp.serialize_pem(), &kp.public_key_pem()).unwrap()
    }

    fn grant(aud: &str, now: i64, secs: i64) -> Grant<'static> {
        Grant {
            namespace: "dev",
            service_account: ObjectRef {
                name: "ci".into(),
                uid: "u-1".into(),
            },
            audiences: vec![aud.to_string()],
            expiration_seconds: secs,
            bound: Some((
                "Pod",
                ObjectRef {
                    name: "web".into(),
                    uid: "p-1".into(),
                },
            )),
            now,
            id: "j-1".into(),
        }
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn issued_tokens_verify_and_name_the_service_account() {
        let key = test_key();
        let (token, claims) = key.issue(grant(ISSUER, now(), 3600)).unwrap();
        let got = key.verify(&token).unwrap();
        assert_eq!(got, claims);
        let user = got.user();
        assert_eq!(user.name, "system:serviceaccount:dev:ci");
        assert!(user
            .groups
            .contains(&"system:serviceaccounts:dev".to_string()));
        assert_eq!(user.uid, "u-1");
        assert_eq!(
            user.extra["authentication.kubernetes.io/pod-name"],
            vec!["web".to_string()]
        );
    }

    #[test]
    fn bound_claims_are_kubernetes_shape() {
        let key = test_key();
        let (token, _) = key.issue(grant(ISSUER, 1_000, 3607)).unwrap();
        let payload = token.split('.').nth(1).unwrap();
        use base64::Engine;
        let claims: serde_json::Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            claims["kubernetes.io"],
            serde_json::json!({"namespace": "dev",
                "pod": {"name": "web", "uid": "p-1"},
                "serviceaccount": {"name": "ci", "uid": "u-1"}})
        );
        assert_eq!(claims["sub"], "system:serviceaccount:dev:ci");
        assert_eq!(claims["aud"], serde_json::json!([ISSUER]));
        assert_eq!(
            (claims["iat"].as_i64(), claims["exp"].as_i64()),
            (Some(1_000), Some(4_607))
        );
    }

    #[test]
    fn bad_tokens_are_refused() {
        let key = test_key();
        let (expired, _) = key.issue(grant(ISSUER, now() - 7200, 3600)).unwrap();
        assert!(key.verify(&expired).is_err());
        let (other_aud, _) = key.issue(grant("vault", now(), 3600)).unwrap();
        assert!(key.verify(&other_aud).is_err());
        let (foreign, _) = test_key().issue(grant(ISSUER, now(), 3600)).unwrap();
        assert!(key.verify(&foreign).is_err(), "signed by another key");
        let (good, _) = key.issue(grant(ISSUER, now(), 3600)).unwrap();
        let mut tampered = good.clone();
        tampered.insert(good.len() / 2, 'x');
        assert!(key.verify(&tampered).is_err());
        for junk in ["", "a.b.c", "not a token", "....."] {
            assert!(key.verify(junk).is_err(), "{junk:?}");
        }
    }
}
