//! Cluster PKI: the certificate authority and the member certificates that secure rkube's gRPC
//! traffic with mutual TLS.
//!
//! The layout follows kubeadm's `/etc/kubernetes/pki`: one directory holds the cluster CA
//! (`ca.crt`, `ca.key`) and, beside it, a `<name>.crt` / `<name>.key` pair per member or client.
//!
//! - [`init_ca`] creates the CA once; later calls leave it alone.
//! - [`issue`] signs a leaf certificate with that CA, once per name.
//! - [`TlsFiles`] names the three files a member needs and [`TlsFiles::load`] reads them into
//!   [`TlsMaterial`], which builds tonic's server and client TLS configurations. Both sides
//!   present a certificate and check the peer's against the CA.
//! - [`ca_spki_sha256`] pins the CA the way kubeadm's `--discovery-token-ca-cert-hash` does, so a
//!   joining member can check it talks to the right cluster before it trusts the CA it is handed.
//!
//! Keys are ECDSA P-256, written as PKCS#8 PEM with mode 0600; certificates are PEM.

use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};

/// File name of the CA certificate inside the PKI directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside the PKI directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// Common name of the cluster CA.
pub const CA_COMMON_NAME: &str = "rkube-ca";

/// How long the CA is valid (kubeadm: 10 years).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
/// How long a leaf certificate is valid.
const LEAF_VALIDITY: Duration = Duration::from_secs(5 * 365 * 24 * 60 * 60);
/// Certificates start this long before "now", so members whose clocks lag a little still accept
/// a certificate issued elsewhere right away.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

const KEY_MODE: u32 = 0o600;
const CERT_MODE: u32 = 0o644;

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

    /// The CA certificate handed to [`ca_spki_sha256`] is not PEM.
    #[error("the CA certificate is not valid PEM: {source}")]
    CaPem {
        #[source]
        source: rustls::pki_types::pem::Error,
    },

    /// The CA certificate handed to [`ca_spki_sha256`] is not a valid X.509 certificate.
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

/// Creates `dir` if needed and, unless `dir/ca.crt` already exists, a new self-signed cluster CA
/// in it: `ca.crt` and `ca.key` (mode 0600).
///
/// # Correctness
///
/// `ca.crt` is the marker that a CA exists, so the key is written first: a crash between the two
/// writes leaves no `ca.crt` and the next call starts over. Callers must not run `init_ca` on the
/// same directory concurrently; the last writer would win and certificates issued by the other
/// CA would stop verifying.
pub fn init_ca(dir: &Path) -> Result<(), PkiError> {
    fs::create_dir_all(dir).map_err(|source| PkiError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let cert_path = dir.join(CA_CERT_FILE);
    if cert_path.exists() {
        return Ok(());
    }

    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(CA_COMMON_NAME, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    set_validity(&mut params, CA_VALIDITY)?;

    let key = generate_key("generate the CA key")?;
    let cert = params
        .self_signed(&key)
        .map_err(|source| PkiError::Generate {
            what: "self-sign the CA certificate",
            source,
        })?;

    write_file(
        &dir.join(CA_KEY_FILE),
        key.serialize_pem().as_bytes(),
        KEY_MODE,
        "CA key",
    )?;
    write_file(
        &cert_path,
        cert.pem().as_bytes(),
        CERT_MODE,
        "CA certificate",
    )
}

/// File name of the key that signs service account tokens (kubeadm's `sa.key`).
pub const SA_KEY_FILE: &str = "sa.key";

/// Creates `dir/sa.key` (ECDSA P-256, mode 0600) unless it exists: the key every control-plane
/// member signs and checks service account tokens with, so it is shared like the CA.
pub fn init_service_account_key(dir: &Path) -> Result<(), PkiError> {
    let path = dir.join(SA_KEY_FILE);
    if path.exists() {
        return Ok(());
    }
    let key = generate_key("generate the service account signing key")?;
    write_file(
        &path,
        key.serialize_pem().as_bytes(),
        KEY_MODE,
        "service account signing key",
    )
}

/// The service account signing key at `path`: its private key (PKCS#8 PEM) and public key
/// (SubjectPublicKeyInfo PEM).
pub fn load_service_account_key(path: &Path) -> Result<(String, String), PkiError> {
    let pem = read_file(path, "service account signing key")?;
    let text = String::from_utf8_lossy(&pem).to_string();
    let key = KeyPair::from_pem(&text).map_err(|source| PkiError::Parse {
        what: "service account signing key",
        path: path.to_path_buf(),
        source,
    })?;
    Ok((text, key.public_key_pem()))
}

/// Issues `dir/<name>.crt` and `dir/<name>.key` (mode 0600), signed by the CA in `dir`.
///
/// The subject is `CN=<common_name>` plus `O=<organization>` when given (Kubernetes reads the
/// organization as the user's group). Each entry of `sans` becomes an IP SAN when it parses as an
/// IP address and a DNS SAN otherwise. `server` and `client` select the extended key usages
/// ServerAuth and ClientAuth; at least one must be set. The certificate is valid for five years.
///
/// Does nothing when both files already exist; when only one does, both are issued anew.
pub fn issue(
    dir: &Path,
    name: &str,
    common_name: &str,
    organization: Option<&str>,
    sans: &[String],
    server: bool,
    client: bool,
) -> Result<(), PkiError> {
    validate_name(name)?;
    if !server && !client {
        return Err(PkiError::NoUsage {
            name: name.to_string(),
        });
    }
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    if cert_path.exists() && key_path.exists() {
        return Ok(());
    }

    let ca = Ca::load(dir)?;

    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(common_name, organization);
    params.subject_alt_names = sans
        .iter()
        .map(|san| parse_san(san))
        .collect::<Result<_, _>>()?;
    leaf_usages(&mut params, server, client);
    set_validity(&mut params, LEAF_VALIDITY)?;

    let key = generate_key("generate the certificate key")?;
    let cert = params
        .signed_by(&key, &ca.cert, &ca.key)
        .map_err(|source| PkiError::Generate {
            what: "sign the certificate with the CA",
            source,
        })?;

    write_file(
        &key_path,
        key.serialize_pem().as_bytes(),
        KEY_MODE,
        "private key",
    )?;
    write_file(&cert_path, cert.pem().as_bytes(), CERT_MODE, "certificate")
}

/// File stem of the certificate the API servers present to node agents (kubeadm's).
/// Kubernetes' signer of kubelet client certificates (`system:node:<name>` in `system:nodes`).
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Kubernetes' signer of API client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

pub const KUBELET_CLIENT: &str = "apiserver-kubelet-client";

/// `dir/apiserver-kubelet-client.{crt,key}`: CN kube-apiserver-kubelet-client, the identity
/// every API server uses toward node agents, which accept only it.
pub fn issue_kubelet_client(dir: &Path) -> Result<(), PkiError> {
    issue(
        dir,
        KUBELET_CLIENT,
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        &[],
        false,
        true,
    )
}

/// Returns `"sha256:<hex>"`, the SHA-256 of the CA certificate's DER SubjectPublicKeyInfo, the
/// same value as kubeadm's `--discovery-token-ca-cert-hash`. Only the first certificate in
/// `ca_pem` counts.
pub fn ca_spki_sha256(ca_pem: &[u8]) -> Result<String, PkiError> {
    let der =
        CertificateDer::from_pem_slice(ca_pem).map_err(|source| PkiError::CaPem { source })?;
    let spki =
        subject_public_key_info(&der).map_err(|source| PkiError::CaCertificate { source })?;
    Ok(format!("sha256:{}", hex(&Sha256::digest(spki))))
}

/// The cluster CA, loaded to sign certificate signing requests (the CSR signer of the
/// controller manager).
pub struct CsrSigner {
    ca: Ca,
}

/// A subject as a CSR names it: CN and every O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrSubject {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// DNS and IP subject alternative names.
    pub sans: Vec<String>,
}

/// Parses a PEM certificate signing request (and checks its self-signature).
pub fn parse_csr(pem: &str) -> Result<CsrSubject, PkiError> {
    use x509_parser::prelude::FromDer;
    let block = ::pem::parse(pem).map_err(|e| PkiError::InvalidCsr(format!("not PEM: {e}")))?;
    if block.tag() != "CERTIFICATE REQUEST" && block.tag() != "NEW CERTIFICATE REQUEST" {
        return Err(PkiError::InvalidCsr(format!(
            "the PEM block is a {:?}, not a CERTIFICATE REQUEST",
            block.tag()
        )));
    }
    let (_, csr) =
        x509_parser::certification_request::X509CertificationRequest::from_der(block.contents())
            .map_err(|e| PkiError::InvalidCsr(e.to_string()))?;
    csr.verify_signature()
        .map_err(|_| PkiError::InvalidCsr("its signature does not verify".into()))?;
    let subject = &csr.certification_request_info.subject;
    let common_name = subject
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or("")
        .to_string();
    let organizations = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    let mut sans = Vec::new();
    for ext in csr.requested_extensions().into_iter().flatten() {
        if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
            for name in &san.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(d) => sans.push(d.to_string()),
                    x509_parser::extensions::GeneralName::IPAddress(ip) => {
                        if let Ok(a) = <[u8; 4]>::try_from(*ip) {
                            sans.push(IpAddr::from(a).to_string());
                        } else if let Ok(a) = <[u8; 16]>::try_from(*ip) {
                            sans.push(IpAddr::from(a).to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(CsrSubject {
        common_name,
        organizations,
        sans,
    })
}

/// A new ECDSA P-256 key and a PEM certificate signing request for `CN=<cn>, O=<o>...`:
/// (request PEM, private key PEM).
pub fn new_csr(common_name: &str, organizations: &[&str]) -> Result<(String, String), PkiError> {
    let key = generate_key("generate the key of a certificate signing request")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    for o in organizations {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    let csr = params
        .serialize_request(&key)
        .map_err(|source| PkiError::Generate {
            what: "build the certificate signing request",
            source,
        })?;
    let pem = csr.pem().map_err(|source| PkiError::Generate {
        what: "encode the certificate signing request",
        source,
    })?;
    Ok((pem, key.serialize_pem()))
}

impl CsrSigner {
    /// The CA in `dir` (`ca.crt`, `ca.key`).
    pub fn load(dir: &Path) -> Result<CsrSigner, PkiError> {
        Ok(CsrSigner { ca: Ca::load(dir)? })
    }

    /// Signs `csr_pem` for `valid_for`, with the usages a client certificate (and, when
    /// `server`, a serving certificate) needs; returns the certificate PEM.
    pub fn sign(
        &self,
        csr_pem: &str,
        valid_for: Duration,
        client: bool,
        server: bool,
    ) -> Result<String, PkiError> {
        let mut req = rcgen::CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|e| PkiError::InvalidCsr(e.to_string()))?;
        let params = &mut req.params;
        leaf_usages(params, server, client);
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&rand_serial()));
        set_validity(params, valid_for)?;
        let cert = req
            .signed_by(&self.ca.cert, &self.ca.key)
            .map_err(|source| PkiError::Generate {
                what: "sign the certificate signing request",
                source,
            })?;
        Ok(cert.pem())
    }
}

/// A positive random 16-byte serial number.
fn rand_serial() -> [u8; 16] {
    let mut b: [u8; 16] = rand::random();
    b[0] &= 0x7f;
    b[0] |= 0x01;
    b
}

/// The notAfter of the first certificate in `pem`, as seconds since the epoch, and its
/// notBefore.
pub fn validity(pem: &[u8]) -> Result<(i64, i64), PkiError> {
    let der = CertificateDer::from_pem_slice(pem).map_err(|source| PkiError::CaPem { source })?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| PkiError::InvalidCsr(format!("not a certificate: {e}")))?;
    Ok((
        cert.validity().not_before.timestamp(),
        cert.validity().not_after.timestamp(),
    ))
}

/// The three files one member needs for mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster CA certificate that peers' certificates must chain to.
    pub ca: PathBuf,
    /// This member's certificate.
    pub cert: PathBuf,
    /// This member's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// The files of member `name` in PKI directory `dir`: `ca.crt`, `<name>.crt`, `<name>.key`.
    pub fn for_member(dir: &Path, name: &str) -> TlsFiles {
        TlsFiles {
            ca: dir.join(CA_CERT_FILE),
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        }
    }

    /// Reads the three files and checks that each holds PEM of the right kind, so a bad file is
    /// reported by name here rather than as an opaque TLS error when the first connection opens.
    pub fn load(&self) -> Result<TlsMaterial, PkiError> {
        let ca_pem = read_file(&self.ca, "TLS CA certificate")?;
        let cert_pem = read_file(&self.cert, "TLS certificate")?;
        let key_pem = read_file(&self.key, "TLS key")?;

        check_cert_pem(&ca_pem, &self.ca, "TLS CA certificate")?;
        check_cert_pem(&cert_pem, &self.cert, "TLS certificate")?;
        PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| PkiError::Pem {
            what: "TLS key",
            path: self.key.clone(),
            source,
        })?;

        Ok(TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }
}

/// PEM contents of a member's CA certificate, certificate and key.
#[derive(Clone)]
pub struct TlsMaterial {
    /// The cluster CA certificate.
    pub ca_pem: Vec<u8>,
    /// This member's certificate.
    pub cert_pem: Vec<u8>,
    /// This member's private key.
    pub key_pem: Vec<u8>,
}

// The key stays out of logs.
impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem", &format_args!("{} bytes", self.ca_pem.len()))
            .field("cert_pem", &format_args!("{} bytes", self.cert_pem.len()))
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

impl TlsMaterial {
    /// Server side of mutual TLS: presents this member's certificate and requires every client
    /// to present one signed by the cluster CA.
    pub fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(self.identity())
            .client_ca_root(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .client_auth_optional(false)
    }

    /// Client side of mutual TLS: trusts only the cluster CA, expects the server's certificate to
    /// name `domain`, and presents this member's certificate.
    pub fn client_config(&self, domain: &str) -> tonic::transport::ClientTlsConfig {
        tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .identity(self.identity())
            .domain_name(domain)
    }

    fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

/// The CA as loaded for signing: a certificate rebuilt from `ca.crt` (same subject and key
/// identifier, so leaves name it as their issuer) and its key.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn load(dir: &Path) -> Result<Ca, PkiError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = read_file(&cert_path, "CA certificate")?;
        let key_pem = read_file(&key_path, "CA key")?;

        let parse_err = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| PkiError::Parse { what, path, source }
        };
        let key_text = std::str::from_utf8(&key_pem)
            .map_err(|_| rcgen::Error::CouldNotParseKeyPair)
            .map_err(parse_err("CA key", &key_path))?;
        let key = KeyPair::from_pem(key_text).map_err(parse_err("CA key", &key_path))?;
        let cert_text = std::str::from_utf8(&cert_pem)
            .map_err(|_| rcgen::Error::CouldNotParseCertificate)
            .map_err(parse_err("CA certificate", &cert_path))?;
        let params = CertificateParams::from_ca_cert_pem(cert_text)
            .map_err(parse_err("CA certificate", &cert_path))?;

        let der = check_cert_pem(&cert_pem, &cert_path, "CA certificate")?;
        let spki = subject_public_key_info(&der).map_err(|source| PkiError::Certificate {
            what: "CA certificate",
            path: cert_path.clone(),
            source,
        })?;
        if spki != key.public_key_der() {
            return Err(PkiError::CaKeyMismatch {
                cert: cert_path,
                key: key_path,
            });
        }

        // Re-signing only produces an in-memory issuer; rcgen takes the issuer's name and key
        // identifier from it, never its signature.
        let cert = params
            .self_signed(&key)
            .map_err(|source| PkiError::Generate {
                what: "rebuild the CA certificate for signing",
                source,
            })?;
        Ok(Ca { cert, key })
    }
}

fn generate_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| PkiError::Generate { what, source })
}

fn distinguished_name(common_name: &str, organization: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

fn parse_san(san: &str) -> Result<SanType, PkiError> {
    if let Ok(ip) = san.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    if san.is_empty() {
        return Err(PkiError::InvalidSan {
            san: san.to_string(),
            source: None,
        });
    }
    san.try_into()
        .map(SanType::DnsName)
        .map_err(|source| PkiError::InvalidSan {
            san: san.to_string(),
            source: Some(source),
        })
}

/// Names become file names beside `ca.crt`, so they must stay inside the directory and must not
/// shadow the CA itself.
fn validate_name(name: &str) -> Result<(), PkiError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name == "ca"
        || name.contains(['/', '\\', '\0']);
    if bad {
        return Err(PkiError::InvalidName {
            name: name.to_string(),
        });
    }
    Ok(())
}

/// A leaf certificate's key usages: not a CA, signing and key encipherment, and server and/or
/// client authentication (whatever the request asked for is replaced).
fn leaf_usages(params: &mut CertificateParams, server: bool, client: bool) {
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages.clear();
    if server {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ServerAuth);
    }
    if client {
        params
            .extended_key_usages
            .push(ExtendedKeyUsagePurpose::ClientAuth);
    }
    params.use_authority_key_identifier_extension = true;
}

/// Valid from a little before now (see [`CLOCK_SKEW`]) until `valid_for` after now.
fn set_validity(params: &mut CertificateParams, valid_for: Duration) -> Result<(), PkiError> {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| PkiError::ClockBeforeEpoch)?;
    // Whole seconds: X.509 times carry no fractions.
    let since_epoch = Duration::from_secs(since_epoch.as_secs());
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    params.not_before = epoch + since_epoch.saturating_sub(CLOCK_SKEW);
    params.not_after = epoch + since_epoch + valid_for;
    Ok(())
}

fn subject_public_key_info(der: &CertificateDer<'_>) -> Result<Vec<u8>, rustls::Error> {
    let parsed = rustls::server::ParsedCertificate::try_from(der)?;
    Ok(parsed.subject_public_key_info().as_ref().to_vec())
}

fn check_cert_pem(
    pem: &[u8],
    path: &Path,
    what: &'static str,
) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(pem).map_err(|source| PkiError::Pem {
        what,
        path: path.to_path_buf(),
        source,
    })
}

fn read_file(path: &Path, what: &'static str) -> Result<Vec<u8>, PkiError> {
    fs::read(path).map_err(|source| PkiError::Read {
        what,
        path: path.to_path_buf(),
        source,
    })
}

/// Writes `contents` to `path` with `mode` through a temporary file and a rename, so readers see
/// either the old file or the whole new one, never a torn key.
/// Writes a private file (mode 0600) through a temporary file and a rename, so that a crash
/// never leaves half a key.
pub fn write_private(path: &Path, contents: &[u8], what: &'static str) -> Result<(), PkiError> {
    write_file(path, contents, KEY_MODE, what)
}

fn write_file(path: &Path, contents: &[u8], mode: u32, what: &'static str) -> Result<(), PkiError> {
    let write_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PkiError::Write { what, path, source }
    };
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(".tmp");
    let tmp = PathBuf::from(tmp_name);

    // A leftover from a crash may have other permissions; start from a fresh file.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(write_err(&tmp)(err)),
    }
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(write_err(&tmp))?;
    file.write_all(contents).map_err(write_err(&tmp))?;
    file.sync_all().map_err(write_err(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(write_err(path))?;

    // Make the rename itself durable.
    #[cfg(unix)]
    if let Some(dir) = path.parent() {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(write_err(dir))?;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
            // Writing to a String cannot fail.
            let _ = write!(out, "{b:02x}");
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::ClientConnection;
    use rustls::server::{ServerConnection, WebPkiClientVerifier};
    use rustls::{ClientConfig, RootCertStore, ServerConfig};
    use std::sync::Arc;

    /// A PKI directory with a CA, and a builder-style helper to issue leaves into it.
    struct Pki {
        dir: tempfile::TempDir,
    }

    impl Pki {
        fn new() -> Pki {
            let dir = tempfile::tempdir().expect("tempdir");
            init_ca(dir.path()).expect("init_ca");
            Pki { dir }
        }

        fn path(&self) -> &Path {
            self.dir.path()
        }

        fn leaf(&self, name: &str) -> LeafBuilder<'_> {
            LeafBuilder {
                pki: self,
                name: name.to_string(),
                common_name: name.to_string(),
                organization: None,
                sans: vec!["localhost".into(), "127.0.0.1".into()],
                server: true,
                client: true,
            }
        }

        fn material(&self, name: &str) -> TlsMaterial {
            TlsFiles::for_member(self.path(), name)
                .load()
                .expect("load TLS material")
        }

        fn read(&self, file: &str) -> Vec<u8> {
            fs::read(self.path().join(file)).expect("read file")
        }
    }

    struct LeafBuilder<'a> {
        pki: &'a Pki,
        name: String,
        common_name: String,
        organization: Option<String>,
        sans: Vec<String>,
        server: bool,
        client: bool,
    }

    impl LeafBuilder<'_> {
        fn common_name(mut self, cn: &str) -> Self {
            self.common_name = cn.to_string();
            self
        }
        fn organization(mut self, o: &str) -> Self {
            self.organization = Some(o.to_string());
            self
        }
        fn sans(mut self, sans: &[&str]) -> Self {
            self.sans = sans.iter().map(|s| s.to_string()).collect();
            self
        }
        fn usage(mut self, server: bool, client: bool) -> Self {
            self.server = server;
            self.client = client;
            self
        }
        fn try_issue(self) -> Result<(), PkiError> {
            issue(
                self.pki.path(),
                &self.name,
                &self.common_name,
                self.organization.as_deref(),
                &self.sans,
                self.server,
                self.client,
            )
        }
        fn issue(self) {
            self.try_issue().expect("issue");
        }
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn roots(ca_pem: &[u8]) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(cert.expect("CA PEM")).expect("add CA root");
        }
        Arc::new(roots)
    }

    fn chain(m: &TlsMaterial) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_slice_iter(&m.cert_pem)
            .collect::<Result<_, _>>()
            .expect("cert PEM")
    }

    fn key(m: &TlsMaterial) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(&m.key_pem).expect("key PEM")
    }

    /// Runs a TLS handshake in memory between a server holding `server` and a client holding
    /// `client`, each trusting its own `ca_pem`. Returns the first error either side reports.
    fn handshake(
        server: &TlsMaterial,
        client: &TlsMaterial,
        domain: &str,
    ) -> Result<(), rustls::Error> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(roots(&server.ca_pem), provider())
                .build()
                .expect("client verifier");
        let server_config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain(server), key(server))
            .expect("server cert");
        let client_config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots(&client.ca_pem))
            .with_client_auth_cert(chain(client), key(client))
            .expect("client cert");

        let name =
            rustls::pki_types::ServerName::try_from(domain.to_string()).expect("server name");
        let mut c = ClientConnection::new(Arc::new(client_config), name).expect("client conn");
        let mut s = ServerConnection::new(Arc::new(server_config)).expect("server conn");

        for _ in 0..16 {
            let mut buf = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut buf).expect("client write_tls");
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).expect("server read_tls");
                s.process_new_packets()?;
            }

            let mut buf = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut buf).expect("server write_tls");
            }
            let mut rd = &buf[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).expect("client read_tls");
                c.process_new_packets()?;
            }

            if !c.is_handshaking() && !s.is_handshaking() {
                // TLS 1.3: the server judges the client's certificate after the client thinks it
                // is done, so make sure the server has seen everything the client sent.
                let mut buf = Vec::new();
                while c.wants_write() {
                    c.write_tls(&mut buf).expect("client write_tls");
                }
                let mut rd = &buf[..];
                while !rd.is_empty() {
                    s.read_tls(&mut rd).expect("server read_tls");
                    s.process_new_packets()?;
                }
                return Ok(());
            }
        }
        panic!("TLS handshake did not finish");
    }

    #[test]
    fn init_ca_is_idempotent_and_writes_a_private_key() {
        let pki = Pki::new();
        let cert = pki.read(CA_CERT_FILE);
        let key = pki.read(CA_KEY_FILE);
        init_ca(pki.path()).expect("second init_ca");
        assert_eq!(pki.read(CA_CERT_FILE), cert, "ca.crt changed");
        assert_eq!(pki.read(CA_KEY_FILE), key, "ca.key changed");

        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(pki.path().join(CA_KEY_FILE))
                .expect("stat ca.key")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!pki.path().join("ca.key.tmp").exists());
    }

    #[test]
    fn init_ca_creates_missing_directories() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("etc/rkube/pki");
        init_ca(&dir).expect("init_ca");
        assert!(dir.join(CA_CERT_FILE).exists());
        assert!(dir.join(CA_KEY_FILE).exists());
    }

    #[test]
    fn ca_has_the_expected_attributes() {
        let pki = Pki::new();
        let pem = String::from_utf8(pki.read(CA_CERT_FILE)).expect("utf8");
        let params = CertificateParams::from_ca_cert_pem(&pem).expect("parse CA");
        assert_eq!(params.is_ca, IsCa::Ca(BasicConstraints::Constrained(0)));
        assert_eq!(
            params.key_usages,
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign]
        );
        assert_eq!(
            params.distinguished_name.get(&DnType::CommonName),
            Some(&rcgen::DnValue::Utf8String(CA_COMMON_NAME.into()))
        );
        let days = (params.not_after - params.not_before).whole_days();
        assert_eq!(days, 10 * 365, "CA validity in days");
    }

    #[test]
    fn leaf_has_requested_subject_sans_and_usages() {
        struct Case {
            name: &'static str,
            server: bool,
            client: bool,
            ekus: Vec<ExtendedKeyUsagePurpose>,
        }
        let cases = [
            Case {
                name: "server-only",
                server: true,
                client: false,
                ekus: vec![ExtendedKeyUsagePurpose::ServerAuth],
            },
            Case {
                name: "client-only",
                server: false,
                client: true,
                ekus: vec![ExtendedKeyUsagePurpose::ClientAuth],
            },
            Case {
                name: "both",
                server: true,
                client: true,
                ekus: vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            },
        ];
        let pki = Pki::new();
        for case in cases {
            pki.leaf(case.name)
                .common_name("system:node:n1")
                .organization("system:nodes")
                .sans(&["n1.cluster.local", "10.0.0.7", "::1"])
                .usage(case.server, case.client)
                .issue();
            let pem = String::from_utf8(pki.read(&format!("{}.crt", case.name))).expect("utf8");
            // rcgen's parser reads the fields back; "from_ca_cert" does not require a CA.
            let params = CertificateParams::from_ca_cert_pem(&pem).expect("parse leaf");
            assert_eq!(params.extended_key_usages, case.ekus, "{}", case.name);
            assert_eq!(
                params.key_usages,
                vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment
                ],
                "{}",
                case.name
            );
            assert_eq!(params.is_ca, IsCa::ExplicitNoCa, "{}", case.name);
            assert_eq!(
                params.subject_alt_names,
                vec![
                    SanType::DnsName("n1.cluster.local".try_into().expect("ia5")),
                    SanType::IpAddress("10.0.0.7".parse().expect("ip")),
                    SanType::IpAddress("::1".parse().expect("ip")),
                ],
                "{}",
                case.name
            );
            assert_eq!(
                params.distinguished_name.get(&DnType::CommonName),
                Some(&rcgen::DnValue::Utf8String("system:node:n1".into()))
            );
            assert_eq!(
                params.distinguished_name.get(&DnType::OrganizationName),
                Some(&rcgen::DnValue::Utf8String("system:nodes".into()))
            );
            let days = (params.not_after - params.not_before).whole_days();
            assert_eq!(days, 5 * 365, "{}", case.name);

            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = fs::metadata(pki.path().join(format!("{}.key", case.name)))
                    .expect("stat key")
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{}", case.name);
            }
        }
    }

    #[test]
    fn issue_skips_existing_pair_and_reissues_a_half_pair() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let cert = pki.read("m1.crt");
        let key = pki.read("m1.key");

        pki.leaf("m1").issue();
        assert_eq!(pki.read("m1.crt"), cert);
        assert_eq!(pki.read("m1.key"), key);

        fs::remove_file(pki.path().join("m1.key")).expect("remove key");
        pki.leaf("m1").issue();
        assert_ne!(pki.read("m1.crt"), cert, "certificate was not reissued");
        let m = pki.material("m1");
        handshake(&m, &m, "localhost").expect("reissued pair works");
    }

    #[test]
    fn mutual_tls_accepts_same_ca_and_rejects_others() {
        let pki = Pki::new();
        let other = Pki::new();
        pki.leaf("server").usage(true, false).issue();
        pki.leaf("client").usage(false, true).issue();
        pki.leaf("server-only").usage(true, false).issue();
        other.leaf("intruder").issue();

        let server = pki.material("server");
        let client = pki.material("client");
        let intruder = other.material("intruder");
        // The intruder's certificate but our CA as its trust root: it trusts us, we must not
        // trust it.
        let intruder_trusting_us = TlsMaterial {
            ca_pem: pki.read(CA_CERT_FILE),
            ..intruder.clone()
        };
        // A client holding a certificate without ClientAuth.
        let server_only_as_client = pki.material("server-only");

        struct Case<'a> {
            what: &'static str,
            server: &'a TlsMaterial,
            client: &'a TlsMaterial,
            domain: &'static str,
            /// `None`: the handshake must succeed; otherwise the certificate error it must fail with.
            reject: Option<fn(&rustls::CertificateError) -> bool>,
        }
        use rustls::CertificateError as E;
        let cases = [
            Case {
                what: "same CA",
                server: &server,
                client: &client,
                domain: "localhost",
                reject: None,
            },
            Case {
                what: "IP SAN",
                server: &server,
                client: &client,
                domain: "127.0.0.1",
                reject: None,
            },
            Case {
                what: "client cert from another CA",
                server: &server,
                client: &intruder_trusting_us,
                domain: "localhost",
                // Both CAs are named "rkube-ca", so the chain is found and its signature fails.
                reject: Some(|e| matches!(e, E::BadSignature | E::UnknownIssuer)),
            },
            Case {
                what: "server cert from another CA",
                server: &intruder,
                client: &client,
                domain: "localhost",
                reject: Some(|e| matches!(e, E::BadSignature | E::UnknownIssuer)),
            },
            Case {
                what: "client cert without ClientAuth",
                server: &server,
                client: &server_only_as_client,
                domain: "localhost",
                reject: Some(|e| matches!(e, E::InvalidPurposeContext { .. } | E::InvalidPurpose)),
            },
            Case {
                what: "name not in SANs",
                server: &server,
                client: &client,
                domain: "elsewhere.example",
                reject: Some(|e| {
                    matches!(e, E::NotValidForNameContext { .. } | E::NotValidForName)
                }),
            },
        ];
        for case in cases {
            match (
                case.reject,
                handshake(case.server, case.client, case.domain),
            ) {
                (None, result) => result.unwrap_or_else(|e| panic!("{}: {e}", case.what)),
                (Some(check), Err(rustls::Error::InvalidCertificate(e))) => {
                    assert!(check(&e), "{}: unexpected rejection {e:?}", case.what)
                }
                (Some(_), other) => {
                    panic!("{}: want a certificate error, got {other:?}", case.what)
                }
            }
        }
    }

    #[test]
    fn ca_spki_hash_matches_the_ca_public_key() {
        let pki = Pki::new();
        let ca_pem = pki.read(CA_CERT_FILE);
        let hash = ca_spki_sha256(&ca_pem).expect("hash");

        let key_pem = String::from_utf8(pki.read(CA_KEY_FILE)).expect("utf8");
        let key = KeyPair::from_pem(&key_pem).expect("CA key");
        let expected = format!("sha256:{}", hex(&Sha256::digest(key.public_key_der())));
        assert_eq!(hash, expected);
        assert_eq!(hash.len(), "sha256:".len() + 64);

        assert_eq!(ca_spki_sha256(&ca_pem).expect("hash again"), hash, "stable");
        let other = Pki::new();
        assert_ne!(
            ca_spki_sha256(&other.read(CA_CERT_FILE)).expect("hash"),
            hash
        );
    }

    #[test]
    fn ca_spki_hash_rejects_garbage() {
        let not_pem = b"hello".as_slice();
        let bad_der =
            b"-----BEGIN CERTIFICATE-----\naGVsbG8=\n-----END CERTIFICATE-----\n".as_slice();
        assert!(matches!(
            ca_spki_sha256(not_pem),
            Err(PkiError::CaPem { .. })
        ));
        assert!(matches!(
            ca_spki_sha256(bad_der),
            Err(PkiError::CaCertificate { .. })
        ));
    }

    #[test]
    fn load_names_the_missing_file() {
        let pki = Pki::new();
        let files = TlsFiles::for_member(pki.path(), "absent");
        let err = files.load().expect_err("must fail");
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            format!(
                "cannot read TLS certificate {}: No such file or directory",
                pki.path().join("absent.crt").display()
            )
        );
    }

    #[test]
    fn load_rejects_a_file_of_the_wrong_kind() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let files = TlsFiles {
            key: pki.path().join("m1.crt"),
            ..TlsFiles::for_member(pki.path(), "m1")
        };
        let err = files.load().expect_err("a certificate is not a key");
        assert!(
            matches!(
                &err,
                PkiError::Pem {
                    what: "TLS key",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn issue_rejects_bad_input() {
        let pki = Pki::new();
        let cases: [(&str, LeafBuilder<'_>); 6] = [
            ("empty name", pki.leaf("")),
            ("path in name", pki.leaf("../escape")),
            ("ca name", pki.leaf("ca")),
            ("no usage", pki.leaf("m1").usage(false, false)),
            ("non-ASCII DNS", pki.leaf("m2").sans(&["nöde.example"])),
            ("empty SAN", pki.leaf("m3").sans(&[""])),
        ];
        for (what, leaf) in cases {
            let err = leaf.try_issue().expect_err(what);
            let expected = match what {
                "empty name" | "path in name" | "ca name" => {
                    matches!(err, PkiError::InvalidName { .. })
                }
                "no usage" => matches!(err, PkiError::NoUsage { .. }),
                _ => matches!(err, PkiError::InvalidSan { .. }),
            };
            assert!(expected, "{what}: {err}");
        }
        assert!(!pki.path().join("m1.crt").exists());
    }

    #[test]
    fn issue_without_ca_or_with_mismatched_key_fails_clearly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = issue(dir.path(), "m1", "m1", None, &[], true, true).expect_err("no CA");
        assert!(err.is_not_found(), "{err}");
        assert!(
            err.to_string().starts_with("cannot read CA certificate "),
            "{err}"
        );

        let pki = Pki::new();
        let other = Pki::new();
        fs::copy(other.path().join(CA_KEY_FILE), pki.path().join(CA_KEY_FILE)).expect("copy key");
        let err = pki.leaf("m1").try_issue().expect_err("mismatched key");
        assert!(matches!(err, PkiError::CaKeyMismatch { .. }), "{err}");
    }

    #[test]
    fn tonic_accepts_the_configs() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let m = pki.material("m1");
        tonic::transport::Server::builder()
            .tls_config(m.server_config())
            .expect("server TLS config");
        tonic::transport::Endpoint::from_static("https://127.0.0.1:1")
            .tls_config(m.client_config("localhost"))
            .expect("client TLS config");
    }

    /// Makes one gRPC call over `client` to a tonic server on `addr`. Any route answers
    /// Unimplemented, so `Ok(Code::Unimplemented)` means TLS and HTTP/2 both worked.
    async fn grpc_call(
        addr: std::net::SocketAddr,
        client: tonic::transport::ClientTlsConfig,
    ) -> Result<tonic::Code, String> {
        let endpoint = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
            .map_err(|e| e.to_string())?
            .tls_config(client)
            .map_err(|e| e.to_string())?;
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("connect: {e:?}"))?;
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| format!("ready: {e:?}"))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/rkube.test.Pki/Ping");
        let codec = tonic::codec::ProstCodec::<(), ()>::default();
        match grpc.unary(tonic::Request::new(()), path, codec).await {
            Ok(_) => Ok(tonic::Code::Ok),
            Err(status) => Ok(status.code()),
        }
    }

    #[tokio::test]
    async fn tonic_server_requires_a_client_certificate_from_the_cluster_ca() {
        let pki = Pki::new();
        let other = Pki::new();
        pki.leaf("server").usage(true, false).issue();
        pki.leaf("client").usage(false, true).issue();
        other.leaf("intruder").issue();
        let server = pki.material("server");
        let client = pki.material("client");
        let intruder = TlsMaterial {
            ca_pem: pki.read(CA_CERT_FILE),
            ..other.material("intruder")
        };

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(
            tonic::transport::Server::builder()
                .tls_config(server.server_config())
                .expect("server TLS config")
                .add_routes(tonic::service::Routes::default())
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    async {
                        let _ = stopped.await;
                    },
                ),
        );

        let bounded =
            |config| tokio::time::timeout(Duration::from_secs(10), grpc_call(addr, config));
        let no_identity = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&client.ca_pem))
            .domain_name("localhost");

        let good = bounded(client.client_config("localhost"))
            .await
            .expect("in time");
        assert_eq!(good, Ok(tonic::Code::Unimplemented), "member client");
        let by_ip = bounded(client.client_config("127.0.0.1"))
            .await
            .expect("in time");
        assert_eq!(
            by_ip,
            Ok(tonic::Code::Unimplemented),
            "member client, IP SAN"
        );

        for (what, config) in [
            ("client without a certificate", no_identity),
            (
                "client certificate from another CA",
                intruder.client_config("localhost"),
            ),
        ] {
            let result = bounded(config).await.expect("in time");
            assert!(
                !matches!(result, Ok(tonic::Code::Unimplemented) | Ok(tonic::Code::Ok)),
                "{what} got through: {result:?}"
            );
        }

        let _ = stop.send(());
        serving.await.expect("server task").expect("server");
    }

    #[test]
    fn debug_does_not_print_the_key() {
        let pki = Pki::new();
        pki.leaf("m1").issue();
        let m = pki.material("m1");
        let shown = format!("{m:?}");
        assert!(shown.contains("<redacted>"));
        assert!(!shown.contains("PRIVATE KEY"));
    }
}
