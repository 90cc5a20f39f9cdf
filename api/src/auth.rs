//! Who is asking: the user a request authenticates as. x509 client certificates signed by the
//! cluster CA name the user (CN) and groups (O), as in Kubernetes; a request with no credential
//! is anonymous and may only reach the health and version endpoints.

use rustls::pki_types::CertificateDer;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
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
    Some(User { name, groups })
}
