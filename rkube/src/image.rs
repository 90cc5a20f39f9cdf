//! Images for the local cluster's containerd nodes, which pull nothing: the pause image every
//! pod sandbox runs (built here, as a tiny static program), and `rkube image load FILE.tar`,
//! which imports an OCI or Docker image archive into every node (as `kind load
//! image-archive` does).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use sha2::{Digest, Sha256};

use crate::up::{LocalCluster, DEFAULT_DIR};

/// The sandbox image the local nodes' containerd is configured with.
pub const PAUSE_IMAGE: &str = "rkube.local/pause:3";

/// A static Linux program that waits forever and does nothing else: the process holding a pod
/// sandbox's namespaces. containerd stops sandboxes with SIGKILL, so it needs no handler.
/// One ELF header, one loadable segment, then the code: `loop { pause() }`.
fn pause_program() -> Result<Vec<u8>> {
    let (machine, code): (u16, &[u8]) = match std::env::consts::ARCH {
        // mov eax, 34 (pause); syscall; jmp back to the mov
        "x86_64" => (62, &[0xb8, 0x22, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7]),
        other => bail!(
            "the pause image is built for x86_64 only, not {other}: use --runtime sim on this machine"
        ),
    };
    const BASE: u64 = 0x40_0000;
    const EHSIZE: u64 = 64;
    const PHSIZE: u64 = 56;
    let size = EHSIZE + PHSIZE + code.len() as u64;
    let mut elf = Vec::with_capacity(size as usize);
    elf.extend_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    elf.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    elf.extend_from_slice(&machine.to_le_bytes());
    elf.extend_from_slice(&1u32.to_le_bytes()); // EV_CURRENT
    elf.extend_from_slice(&(BASE + EHSIZE + PHSIZE).to_le_bytes()); // entry: the code
    elf.extend_from_slice(&EHSIZE.to_le_bytes()); // program headers right after this one
    elf.extend_from_slice(&0u64.to_le_bytes()); // no section headers
    elf.extend_from_slice(&0u32.to_le_bytes()); // flags
    elf.extend_from_slice(&(EHSIZE as u16).to_le_bytes());
    elf.extend_from_slice(&(PHSIZE as u16).to_le_bytes());
    elf.extend_from_slice(&1u16.to_le_bytes()); // one program header
    elf.extend_from_slice(&[0; 6]); // section header size, count, names index
    elf.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    elf.extend_from_slice(&5u32.to_le_bytes()); // readable, executable
    elf.extend_from_slice(&0u64.to_le_bytes()); // from the file's start
    elf.extend_from_slice(&BASE.to_le_bytes()); // vaddr
    elf.extend_from_slice(&BASE.to_le_bytes()); // paddr
    elf.extend_from_slice(&size.to_le_bytes()); // filesz
    elf.extend_from_slice(&size.to_le_bytes()); // memsz
    elf.extend_from_slice(&0x1000u64.to_le_bytes()); // align
    elf.extend_from_slice(code);
    Ok(elf)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One tar archive of `(path, mode, contents)` files, owned by root, dated at the epoch (the
/// same input gives the same bytes, hence the same digests).
fn tar_of(files: &[(&str, u32, &[u8])]) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, mode, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, path, *data)?;
    }
    Ok(b.into_inner()?)
}

/// The pause image as an OCI image-layout archive (what `ctr images import` reads).
pub fn pause_archive() -> Result<Vec<u8>> {
    let layer = tar_of(&[("pause", 0o755, &pause_program()?)])?;
    let layer_digest = sha256_hex(&layer);
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": {"Entrypoint": ["/pause"]},
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{layer_digest}")]},
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", sha256_hex(&config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer.len(),
        }],
    }))?;
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", sha256_hex(&manifest)),
            "size": manifest.len(),
            "annotations": {
                "io.containerd.image.name": PAUSE_IMAGE,
                "org.opencontainers.image.ref.name": PAUSE_IMAGE.rsplit(':').next(),
            },
        }],
    }))?;
    let blob = |b: &[u8]| format!("blobs/sha256/{}", sha256_hex(b));
    let (layer_path, config_path, manifest_path) = (blob(&layer), blob(&config), blob(&manifest));
    tar_of(&[
        ("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#),
        ("index.json", 0o644, &index),
        (&manifest_path, 0o644, &manifest),
        (&config_path, 0o644, &config),
        (&layer_path, 0o644, &layer),
    ])
}

/// Imports an image archive into the containerd at `socket` (the namespace the CRI uses); the
/// names of the images it held.
pub fn import(socket: &Path, archive: &Path) -> Result<Vec<String>> {
    let out = std::process::Command::new("ctr")
        .args(["-n", "k8s.io", "--address"])
        .arg(socket)
        .args(["images", "import"])
        .arg(archive)
        .output()
        .context("running ctr (containerd's client, from the containerd package)")?;
    if !out.status.success() {
        bail!(
            "importing {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // ctr prints "unpacking NAME (sha256:...)...done" or "NAME saved" depending on its version.
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    Ok(text
        .lines()
        .filter_map(|l| {
            l.split_whitespace()
                .find(|w| w.contains(':') && !w.starts_with("(sha256"))
        })
        .map(str::to_string)
        .collect())
}

/// Writes the pause archive under `dir` and imports it into the containerd at `socket`.
pub fn import_pause(dir: &Path, socket: &Path) -> Result<()> {
    let path = dir.join("pause.tar");
    let mut f = std::fs::File::create(&path)?;
    f.write_all(&pause_archive()?)?;
    import(socket, &path)?;
    Ok(())
}

#[derive(Debug, Clone, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub command: ImageCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ImageCommand {
    /// Loads an OCI or Docker image archive (`docker save`, `ctr images export`...) into every
    /// node of the local cluster, so pods can use it without a registry.
    Load(LoadArgs),
}

#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// The local cluster's directory (the one `rkube up` used).
    #[arg(long, default_value = DEFAULT_DIR)]
    pub dir: PathBuf,
    /// The image archive.
    pub file: PathBuf,
}

pub fn run(args: ImageArgs) -> Result<()> {
    let ImageCommand::Load(args) = args.command;
    let cluster = LocalCluster::load(&args.dir)?;
    if !args.file.is_file() {
        bail!("{} is not a file", args.file.display());
    }
    let Some(net) = &cluster.network else {
        bail!(
            "the cluster in {} runs its agents with the simulated runtime: its pods run no images",
            args.dir.display()
        );
    };
    let abs = std::fs::canonicalize(&args.dir)?;
    let file = std::fs::canonicalize(&args.file)?;
    for i in 1..=cluster.agents {
        let name = crate::up::agent_name(i);
        let socket = net.containerd_socket(&abs, &name);
        if !socket.exists() {
            bail!("{name}'s containerd is not running (start the cluster with rkube up)");
        }
        let names = import(&socket, &file).with_context(|| format!("loading into {name}"))?;
        println!("{name}: loaded {}", names.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_archive_s_blobs_match_their_digests() {
        if std::env::consts::ARCH != "x86_64" {
            assert!(pause_archive().is_err());
            return;
        }
        let archive = pause_archive().unwrap();
        assert_eq!(
            archive,
            pause_archive().unwrap(),
            "the same bytes every time"
        );
        let mut files = std::collections::HashMap::new();
        for e in tar::Archive::new(&archive[..]).entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().display().to_string();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            files.insert(path, data);
        }
        for (path, data) in &files {
            if let Some(hex) = path.strip_prefix("blobs/sha256/") {
                assert_eq!(hex, sha256_hex(data));
            }
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let manifest = index["manifests"][0]["digest"].as_str().unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&files[&format!("blobs/sha256/{}", &manifest[7..])]).unwrap();
        let layer = manifest["layers"][0]["digest"].as_str().unwrap();
        let layer = &files[&format!("blobs/sha256/{}", &layer[7..])];
        let mut program = Vec::new();
        for e in tar::Archive::new(&layer[..]).entries().unwrap() {
            let mut e = e.unwrap();
            assert_eq!(e.path().unwrap().display().to_string(), "pause");
            assert_eq!(e.header().mode().unwrap(), 0o755);
            std::io::Read::read_to_end(&mut e, &mut program).unwrap();
        }
        assert_eq!(&program[..4], b"\x7fELF");
        let entry = u64::from_le_bytes(program[24..32].try_into().unwrap());
        assert_eq!(entry - 0x40_0000, 120, "the code follows both headers");
    }
}
