//! The key that signs service account tokens, shared by every control-plane member like the CA.

use std::path::Path;

use rcgen::KeyPair;

use crate::cert::generate_key;
use crate::error::PkiError;
use crate::files::{read_file, write_file, KEY_MODE};

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
