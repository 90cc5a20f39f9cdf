//! Who is asking: the user a request authenticates as. x509 client certificates signed by the
//! cluster CA name the user (CN) and groups (O), as in Kubernetes; a request with no credential
//! is anonymous and may only reach the health and version endpoints. Service account tokens
//! ([`crate::token`]) authenticate as their service account; Impersonate-* headers switch to
//! another user when RBAC allows the real one to `impersonate` it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use rustls::pki_types::CertificateDer;

use crate::error::ApiError;
use crate::rbac::Attributes;
use crate::storage::Freshness;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    /// Set for service accounts (their object's uid) and by impersonation.
    pub uid: String,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            ..User::default()
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "system:anonymous"
    }
}

/// The user a verified client certificate names. The TLS layer has already checked it chains to
/// the cluster CA.
pub fn from_certificate(cert: &CertificateDer<'_>) -> Option<User> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_string();
    let mut groups: Vec<String> = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    groups.push("system:authenticated".into());
    Some(User {
        name,
        groups,
        ..User::default()
    })
}

/// A request's credentials, checked: the connection's client certificate first, then a bearer
/// token; neither makes the request anonymous.
impl crate::handler::Api {
    pub(crate) async fn authenticate(
        &self,
        connection: &User,
        headers: &hyper::HeaderMap,
    ) -> Result<User, ApiError> {
        if !connection.is_anonymous() {
            return Ok(connection.clone());
        }
        let Some(auth) = headers.get(hyper::header::AUTHORIZATION) else {
            return Ok(User::anonymous());
        };
        let token = auth
            .to_str()
            .ok()
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|t| !t.is_empty())
            .ok_or_else(unauthorized)?;
        if let Some((id, secret)) = rkube_core::bootstrap_token::parse(token) {
            return self.authenticate_bootstrap_token(id, secret).await;
        }
        self.authenticate_token(token).await
    }

    /// The user a bootstrap token authenticates as, read from its Secret (a quorum read when
    /// the local state does not have it: a token created a moment ago elsewhere works at once).
    async fn authenticate_bootstrap_token(&self, id: &str, secret: &str) -> Result<User, ApiError> {
        let res = crate::resources::find("", "v1", "secrets")
            .ok_or_else(|| ApiError::internal("secrets are served"))?;
        let key = res.key(
            Some("kube-system"),
            &format!("{}{id}", rkube_core::bootstrap_token::SECRET_PREFIX),
        );
        let stored = match self.store.get(&key, Freshness::Any).await? {
            Some(s) => Some(s),
            None => self.store.get(&key, Freshness::Latest).await?,
        };
        let Some(stored) = stored else {
            tracing::debug!(id, "bootstrap token refused: no such token");
            return Err(unauthorized());
        };
        let checked = serde_json::from_value::<Secret>(stored.object)
            .map_err(|_| "the secret does not decode")
            .and_then(|s| crate::bootstrap_token::check(&s, id, secret, chrono::Utc::now()));
        checked.map_err(|why| {
            tracing::debug!(id, why, "bootstrap token refused");
            unauthorized()
        })
    }

    /// The user a service account token authenticates as: signed by this cluster, for the API
    /// server's audience, unexpired, and its service account (and the object it is bound to)
    /// still the same object, so deleting one revokes its tokens.
    pub(crate) async fn authenticate_token(&self, token: &str) -> Result<User, ApiError> {
        let claims = self.tokens.verify(token).map_err(|e| {
            tracing::debug!(error = %e, "bearer token refused");
            unauthorized()
        })?;
        let k = &claims.kubernetes;
        let ns = k.namespace.as_str();
        self.still_exists("serviceaccounts", Some(ns), &k.serviceaccount)
            .await?;
        if let Some(pod) = &k.pod {
            self.still_exists("pods", Some(ns), pod).await?;
        }
        if let Some(secret) = &k.secret {
            self.still_exists("secrets", Some(ns), secret).await?;
        }
        if let Some(node) = &k.node {
            self.still_exists("nodes", None, node).await?;
        }
        Ok(claims.user())
    }

    async fn still_exists(
        &self,
        plural: &str,
        ns: Option<&str>,
        r: &crate::token::ObjectRef,
    ) -> Result<(), ApiError> {
        let res = crate::resources::find("", "v1", plural)
            .ok_or_else(|| ApiError::internal(format!("{plural} are served")))?;
        let key = res.key(ns, &r.name);
        let same = |s: &Option<crate::storage::Stored>| {
            s.as_ref()
                .and_then(|s| s.object.pointer("/metadata/uid"))
                .and_then(serde_json::Value::as_str)
                == Some(r.uid.as_str())
        };
        // The local state answers almost always; a miss is confirmed with a quorum read, as
        // the object may have been created a moment ago through another member.
        let local = self.store.get(&key, Freshness::Any).await?;
        if same(&local) || same(&self.store.get(&key, Freshness::Latest).await?) {
            Ok(())
        } else {
            tracing::debug!(plural, name = %r.name, "token refused: its object is gone");
            Err(unauthorized())
        }
    }

    /// Impersonation (`kubectl --as`, `--as-group`, `--as-uid`): the Impersonate-* headers
    /// make the request act as another user if the real one may `impersonate` each of them.
    pub(crate) fn impersonate(
        &self,
        user: User,
        headers: &hyper::HeaderMap,
    ) -> Result<User, ApiError> {
        let one = |h: &str| {
            headers
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let name = one("impersonate-user");
        let groups: Vec<String> = headers
            .get_all("impersonate-group")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let uid = one("impersonate-uid");
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in headers {
            if let Some(key) = k.as_str().strip_prefix("impersonate-extra-") {
                let key = percent_decode(key);
                if let Ok(v) = v.to_str() {
                    extra.entry(key).or_default().push(v.to_string());
                }
            }
        }
        let Some(name) = name else {
            if !groups.is_empty() || uid.is_some() || !extra.is_empty() {
                return Err(ApiError::bad_request(
                    "impersonating groups, a uid or extra fields requires impersonating a user (Impersonate-User)",
                ));
            }
            return Ok(user);
        };
        let mut checks = Vec::new();
        let mut implied = Vec::new();
        match name
            .strip_prefix("system:serviceaccount:")
            .and_then(|r| r.split_once(':'))
        {
            Some((ns, sa)) => {
                checks.push(Attributes::resource(
                    "impersonate",
                    "",
                    "serviceaccounts",
                    "",
                    ns,
                    sa,
                ));
                implied = vec![
                    "system:serviceaccounts".to_string(),
                    format!("system:serviceaccounts:{ns}"),
                ];
            }
            None => checks.push(Attributes::resource(
                "impersonate",
                "",
                "users",
                "",
                "",
                &name,
            )),
        }
        for g in &groups {
            checks.push(Attributes::resource("impersonate", "", "groups", "", "", g));
        }
        if let Some(u) = &uid {
            checks.push(Attributes::resource(
                "impersonate",
                "authentication.k8s.io",
                "uids",
                "",
                "",
                u,
            ));
        }
        for (k, vs) in &extra {
            for v in vs {
                checks.push(Attributes::resource(
                    "impersonate",
                    "authentication.k8s.io",
                    "userextras",
                    k,
                    "",
                    v,
                ));
            }
        }
        for a in &checks {
            if !self.authz.authorize(&user, a).allowed {
                return Err(a.forbidden(&user));
            }
        }
        let mut all_groups = groups;
        for g in implied {
            if !all_groups.contains(&g) {
                all_groups.push(g);
            }
        }
        if name != "system:anonymous" && !all_groups.iter().any(|g| g == "system:authenticated") {
            all_groups.push("system:authenticated".to_string());
        }
        Ok(User {
            name,
            groups: all_groups,
            uid: uid.unwrap_or_default(),
            extra,
        })
    }
}

fn unauthorized() -> ApiError {
    ApiError::new(401, "Unauthorized", "Unauthorized")
}

/// Impersonate-Extra-<key>: the key is percent-encoded in the header name.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}
