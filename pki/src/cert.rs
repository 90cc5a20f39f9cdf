//! What every certificate here is built from: an ECDSA P-256 key, a subject, a leaf's key usages
//! and a validity period; and reading a PEM certificate back.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use crate::error::PkiError;

/// Certificates start this long before "now", so members whose clocks lag a little still accept
/// a certificate issued elsewhere right away.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

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

pub(crate) fn generate_key(what: &'static str) -> Result<KeyPair, PkiError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|source| PkiError::Generate { what, source })
}

pub(crate) fn distinguished_name(
    common_name: &str,
    organization: Option<&str>,
) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    if let Some(org) = organization {
        dn.push(DnType::OrganizationName, org);
    }
    dn
}

/// A leaf certificate's key usages: not a CA, signing and key encipherment, and server and/or
/// client authentication (whatever the request asked for is replaced).
pub(crate) fn leaf_usages(params: &mut CertificateParams, server: bool, client: bool) {
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
pub(crate) fn set_validity(
    params: &mut CertificateParams,
    valid_for: Duration,
) -> Result<(), PkiError> {
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

pub(crate) fn check_cert_pem(
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
