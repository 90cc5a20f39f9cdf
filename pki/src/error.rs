//! The crate's error: what can go wrong while creating, issuing or loading certificates.

use std::io;
use std::path::PathBuf;

/// What can go wrong while creating, issuing or loading certificates.
///
/// Messages already include the underlying cause (for example "No such file or directory"), so
/// printing the error with `{}` is enough; the cause is also available through `source()`.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// The PKI directory could not be created.
    #[error("cannot create PKI directory {}: {}", .path.display(), describe(.source))]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A certificate or key file could not be read.
    #[error("cannot read {what} {}: {}", .path.display(), describe(.source))]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A certificate or key file could not be written.
    #[error("cannot write {what} {}: {}", .path.display(), describe(.source))]
    Write {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// A file holds no PEM block of the expected kind, or the PEM is damaged.
    #[error("{what} {} is not valid PEM: {source}", .path.display())]
    Pem {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::pki_types::pem::Error,
    },

    /// A PEM certificate does not hold a valid X.509 certificate.
    #[error("{what} {} is not a valid X.509 certificate: {source}", .path.display())]
    Certificate {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },

    /// rcgen could not parse a CA certificate or key.
    #[error("cannot parse {what} {}: {source}", .path.display())]
    Parse {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: rcgen::Error,
    },

    /// `ca.key` is not the private key of `ca.crt`; leaves signed with it would not verify.
    #[error(
        "CA key {} does not belong to CA certificate {}; restore the key that was created with \
         this certificate, or move both away to create a new CA",
        .key.display(),
        .cert.display()
    )]
    CaKeyMismatch { cert: PathBuf, key: PathBuf },

    /// The CA certificate handed to [`ca_spki_sha256`](crate::ca_spki_sha256) is not PEM.
    #[error("the CA certificate is not valid PEM: {source}")]
    CaPem {
        #[source]
        source: rustls::pki_types::pem::Error,
    },

    /// The CA certificate handed to [`ca_spki_sha256`](crate::ca_spki_sha256) is not a valid X.509
    /// certificate.
    #[error("the CA certificate is not a valid X.509 certificate: {source}")]
    CaCertificate {
        #[source]
        source: rustls::Error,
    },

    /// A certificate name is unusable as a file name in the PKI directory.
    #[error(
        "invalid certificate name {name:?}: use a non-empty file name without path separators, \
         other than \"ca\""
    )]
    InvalidName { name: String },

    /// A certificate was requested that allows neither server nor client use.
    #[error("certificate {name:?} must allow server use, client use, or both")]
    NoUsage { name: String },

    /// A subject alternative name is neither an IP address nor a valid DNS name.
    #[error(
        "invalid subject alternative name {san:?}: it is neither an IP address nor a DNS name"
    )]
    InvalidSan {
        san: String,
        #[source]
        source: Option<rcgen::Error>,
    },

    /// Key generation or signing failed.
    #[error("cannot {what}: {source}")]
    Generate {
        what: &'static str,
        #[source]
        source: rcgen::Error,
    },

    /// A certificate signing request could not be parsed or its signature is wrong.
    #[error("the certificate signing request is not valid: {0}")]
    InvalidCsr(String),

    /// The system clock reads before 1970, so no validity period can be computed.
    #[error("the system clock is set before 1970; set the clock correctly and try again")]
    ClockBeforeEpoch,

    /// rustls refused the member's certificate, key or CA for a TLS configuration.
    #[error("cannot build a TLS configuration from this member's certificate, key and CA: {0}")]
    TlsConfig(String),
}

impl PkiError {
    /// True when the error is a file that does not exist, e.g. a member whose certificate has
    /// not been issued yet.
    pub fn is_not_found(&self) -> bool {
        matches!(self, PkiError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// An I/O error as a sentence fragment, without Rust's " (os error N)" suffix, so messages read
/// like the ones Kubernetes and etcd print ("open /x: no such file or directory").
fn describe(err: &io::Error) -> String {
    let text = err.to_string();
    match (err.raw_os_error(), text.rfind(" (os error ")) {
        (Some(_), Some(at)) => text[..at].to_string(),
        _ => text,
    }
}
