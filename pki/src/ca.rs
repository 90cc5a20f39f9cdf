//! The cluster CA: created once in the PKI directory, loaded to sign, and pinned by the hash
//! of its public key.

use std::fs;
use std::path::Path;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};

use crate::cert::{check_cert_pem, distinguished_name, generate_key, set_validity};
use crate::error::PkiError;
use crate::files::{read_file, write_file, CERT_MODE, KEY_MODE};

/// How long the CA is valid (kubeadm: 10 years).
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// File name of the CA certificate inside the PKI directory.
pub const CA_CERT_FILE: &str = "ca.crt";
/// File name of the CA private key inside the PKI directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// Common name of the cluster CA.
pub const CA_COMMON_NAME: &str = "rkube-ca";

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

/// The CA as loaded for signing: a certificate rebuilt from `ca.crt` (same subject and key
/// identifier, so leaves name it as their issuer) and its key.
pub(crate) struct Ca {
    pub(crate) cert: rcgen::Certificate,
    pub(crate) key: KeyPair,
}

impl Ca {
    pub(crate) fn load(dir: &Path) -> Result<Ca, PkiError> {
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

fn subject_public_key_info(der: &CertificateDer<'_>) -> Result<Vec<u8>, rustls::Error> {
    let parsed = rustls::server::ParsedCertificate::try_from(der)?;
    Ok(parsed.subject_public_key_info().as_ref().to_vec())
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
    use crate::testing::Pki;
    use rcgen::DnType;

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
}
