//! Certificate signing requests: Kubernetes' signer names, parsing and creating a request, and
//! the signer that answers one with a certificate from the cluster CA.

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use rcgen::{CertificateParams, DistinguishedName, DnType};

use crate::ca::Ca;
use crate::cert::{generate_key, leaf_usages, set_validity};
use crate::error::PkiError;

/// Kubernetes' signer of kubelet client certificates (`system:node:<name>` in `system:nodes`).
pub const KUBELET_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// Kubernetes' signer of API client certificates.
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";

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
