//! The weight manifest: what the owner holds and how a worker reaches it.
//!
//! JSON, written by the owner with temp + fsync + rename only after every
//! region is uploaded and the broker listens ([`Manifest::publish`]), and
//! removed on a clean exit. Readers check the schema first
//! ([`Manifest::read`]) so that an unknown version is refused by name, not
//! as a parse error. Field-by-field description: `docs/contracts/manifest.md`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The schema this build writes and reads.
pub const SCHEMA: &str = "ds4.weights.manifest/1";
/// The layout name of tensors stored exactly as in the GGUF.
pub const LAYOUT_GGUF: &str = "gguf";
/// A contiguous range of a routed expert tensor's experts, bytes as in the
/// GGUF (one rank of an expert-parallel split).
pub const LAYOUT_GGUF_EXPERTS: &str = "gguf-experts";
/// The scope holding a model's base weights.
pub const SCOPE_BASE: &str = "base";

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Manifest {
    pub schema: String,
    pub owner: Owner,
    pub model: ModelEntry,
    pub backend: BackendEntry,
    pub control: Control,
    pub scopes: BTreeMap<String, Scope>,
    /// Set when this owner holds one rank of a model split over several
    /// GPUs (expert-parallel); absent for the whole model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<crate::layout::rank::Rank>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Owner {
    pub pid: u32,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    /// Bumps on every publish.
    pub generation: u64,
    pub program_version: String,
}

/// Whether process `pid` exists (it may belong to another user): a
/// manifest whose owner pid is gone is stale.
pub fn pid_alive(pid: u32) -> bool {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::EPERM) => true,
        Err(_) => false,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ModelEntry {
    pub family: String,
    /// `general.architecture`.
    pub architecture: String,
    pub shards: Vec<ShardEntry>,
    pub layout_identity: String,
    pub content_identity: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShardEntry {
    pub path: PathBuf,
    pub bytes: u64,
    /// Modification time, seconds since the Unix epoch.
    pub mtime: u64,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// CUDA VMM allocations exported as POSIX file descriptors.
    Vmm,
    /// Sealed memfds, mapped read-only by workers.
    Host,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Vmm => "vmm",
            BackendKind::Host => "host",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BackendEntry {
    pub kind: BackendKind,
    /// Present for `vmm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct DeviceEntry {
    pub ordinal: u32,
    pub uuid: String,
    /// Compute capability, e.g. `sm_90`.
    pub arch: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Control {
    /// `unix:/path` or `host:port`.
    pub grpc: String,
    /// The fd broker's Unix socket.
    pub broker: PathBuf,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Scope {
    pub regions: Vec<RegionEntry>,
    pub tensors: Vec<TensorEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RegionEntry {
    pub id: u32,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub region: u32,
    pub offset: u64,
    pub bytes: u64,
    /// ggml type id (as in the GGUF tensor info).
    pub ggml_type: u32,
    /// ggml order: `shape[0]` is the contiguous row length.
    pub shape: Vec<u64>,
    /// `gguf`, or a named derived layout ([`LAYOUT_GGUF_EXPERTS`]).
    pub layout: String,
    /// `gguf-experts`: the experts `[first, end)` of the file's tensor this
    /// entry holds (its `shape` counts only them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<[u64; 2]>,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(
        "cannot read weight manifest {path}: {error}; is ds4-weight-server running and ready?"
    )]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("weight manifest {path} is not valid JSON ({error}); it may be truncated or from a crashed owner: restart ds4-weight-server")]
    Malformed {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("weight manifest {path} has schema {found:?}, this ds4 reads {expected:?}: run a ds4-weight-server and ds4-server of the same release")]
    UnknownSchema {
        path: PathBuf,
        found: String,
        expected: &'static str,
    },
    #[error("cannot write weight manifest {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl Manifest {
    /// Read and check the schema before anything else. Only a regular
    /// file is read (a FIFO in its place is an error, not a hang).
    pub fn read(path: &Path) -> Result<Manifest, ManifestError> {
        use std::io::Read;
        let read = |error| ManifestError::Read {
            path: path.into(),
            error,
        };
        let mut text = Vec::new();
        ds4_model::gguf::open_regular(path)
            .and_then(|mut f| f.read_to_end(&mut text))
            .map_err(read)?;
        Manifest::parse(path, &text)
    }

    /// Parse manifest bytes read from `path` (the path is for messages).
    pub fn parse(path: &Path, text: &[u8]) -> Result<Manifest, ManifestError> {
        let malformed = |error| ManifestError::Malformed {
            path: path.into(),
            error,
        };
        let value: serde_json::Value = serde_json::from_slice(text).map_err(malformed)?;
        let found = value
            .get("schema")
            .and_then(|s| s.as_str())
            .unwrap_or("(none)");
        if found != SCHEMA {
            return Err(ManifestError::UnknownSchema {
                path: path.into(),
                found: found.to_string(),
                expected: SCHEMA,
            });
        }
        serde_json::from_value(value).map_err(malformed)
    }

    /// Write atomically: a temp file beside `path`, fsync, rename, fsync
    /// the directory. Readers see the old manifest or the new one, never
    /// a part.
    pub fn publish(&self, path: &Path) -> Result<(), ManifestError> {
        let err = |error| ManifestError::Write {
            path: path.into(),
            error,
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "manifest".into());
        let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
        let body = serde_json::to_vec_pretty(self).expect("manifest serializes");
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&body)?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            std::fs::File::open(&dir)?.sync_all()
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }

    pub fn scope(&self, name: &str) -> Option<&Scope> {
        self.scopes.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_in_place_of_the_manifest_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.json");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = Manifest::read(&path).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn pid_alive_sees_this_process_and_not_a_reaped_one() {
        assert!(pid_alive(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(!pid_alive(pid));
    }

    pub(crate) fn sample() -> Manifest {
        let mut scopes = BTreeMap::new();
        scopes.insert(
            SCOPE_BASE.to_string(),
            Scope {
                regions: vec![RegionEntry { id: 0, bytes: 4096 }],
                tensors: vec![TensorEntry {
                    name: "token_embd.weight".into(),
                    region: 0,
                    offset: 0,
                    bytes: 64,
                    ggml_type: 0,
                    shape: vec![4, 4],
                    layout: LAYOUT_GGUF.into(),
                    experts: None,
                }],
            },
        );
        Manifest {
            schema: SCHEMA.into(),
            owner: Owner {
                pid: 1,
                started_at: 2,
                generation: 1,
                program_version: "0.1.0".into(),
            },
            model: ModelEntry {
                family: "llama".into(),
                architecture: "llama".into(),
                shards: vec![ShardEntry {
                    path: "/m.gguf".into(),
                    bytes: 10,
                    mtime: 3,
                }],
                layout_identity: "sha256:aa".into(),
                content_identity: "sha256:bb".into(),
            },
            backend: BackendEntry {
                kind: BackendKind::Host,
                device: None,
            },
            control: Control {
                grpc: "unix:/run/ds4/control.sock".into(),
                broker: "/run/ds4/broker.sock".into(),
            },
            scopes,
            rank: None,
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.json");
        let m = sample();
        m.publish(&path).unwrap();
        assert_eq!(Manifest::read(&path).unwrap(), m);
        // No temp file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

        let text = std::fs::read(&path).unwrap();
        let e = Manifest::parse(&path, &text[..text.len() / 2]).unwrap_err();
        assert!(matches!(e, ManifestError::Malformed { .. }), "{e}");
        assert!(e.to_string().contains("truncated"), "{e}");

        let other = String::from_utf8(text)
            .unwrap()
            .replace(SCHEMA, "ds4.weights.manifest/99");
        let e = Manifest::parse(&path, other.as_bytes()).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("ds4.weights.manifest/99") && msg.contains(SCHEMA),
            "{msg}"
        );
    }
}
