//! Weights from the weight owner (`ds4-weight-server`), or placed by the
//! worker itself.
//!
//! With a manifest ([`attach`]): read and check it, recompute the layout
//! identity from the model file, take a lease over the control plane (with
//! the owner's token when it asks for one), receive the region fds from
//! the broker, import them (`host`: read-only mappings of sealed memfds;
//! `vmm`: CUDA VMM import mapped read-only) and bind tensors to that
//! memory without copying. A task keeps the lease alive; if the owner
//! dies the imported memory stays valid and the worker keeps serving.
//!
//! Without one ([`standalone`]): the same region plan as the owner, filled
//! from the file in this process, so the bound bytes are identical.

mod session;
mod sys;

pub use session::{explicit_model, WeightsArgs, WeightsSession};

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ds4_kernels::vmm;
use ds4_kernels::{DeviceBytes, HostBytes};
use ds4_model::gguf::{GgufFile, TensorInfo};
use ds4_proto::auth::{BearerAuth, Token};
use ds4_proto::broker::{FdReply, FdRequest};
use ds4_proto::client::{connect, ControlAddr, ControlClient};
use ds4_proto::control as pb;
use ds4_proto::layout::rank::Rank;
use ds4_proto::layout::{self, HOST_GRANULARITY, MAX_REGION_BYTES};
use ds4_proto::manifest::{pid_alive, BackendKind, Manifest, ManifestError, Scope, TensorEntry};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("weight owner pid {pid} of manifest {manifest} is gone; restart ds4-weight-server (it publishes a fresh manifest), then this worker")]
    OwnerGone { pid: u32, manifest: PathBuf },
    #[error("manifest {manifest} holds rank {rank} of a model split over GPUs (ds4-weight-server --rank); this worker serves a whole model only: attach it to an owner started without --rank")]
    OneRank { manifest: PathBuf, rank: Rank },
    #[error("manifest {manifest} has no scope {scope:?} (it has: {have}); pass --weights-scope with one of those")]
    NoScope {
        manifest: PathBuf,
        scope: String,
        have: String,
    },
    #[error("{}", error.report(path, "pass the owner's model file with -m, or leave -m out to use the manifest's"))]
    Open {
        path: PathBuf,
        error: ds4_model::gguf::GgufError,
    },
    #[error(transparent)]
    Token(#[from] ds4_proto::auth::TokenError),
    #[error("layout identity mismatch: model file {model} has {model_identity}, manifest {manifest} has {manifest_identity}; start the worker with the owner's model (-m {owner_model}) or restart the owner with this one")]
    Identity {
        model: PathBuf,
        model_identity: String,
        manifest: PathBuf,
        manifest_identity: String,
        owner_model: PathBuf,
    },
    #[error("manifest {manifest}: backend {backend} cannot be imported here: {reason}; {hint}")]
    CannotImport {
        manifest: PathBuf,
        backend: BackendKind,
        reason: String,
        hint: &'static str,
    },
    #[error("cannot reach the weight owner's control plane at {addr}: {message}; is ds4-weight-server running? (check: ds4-weight-server status --manifest {manifest})")]
    Control {
        addr: String,
        message: String,
        manifest: PathBuf,
    },
    #[error("the weight owner refused to attach: {0}")]
    Refused(String),
    #[error("fd broker {path}: {message}")]
    Broker { path: PathBuf, message: String },
    #[error("importing region {region}: {message}")]
    Import { region: u32, message: String },
    #[error("manifest {0} is a synthetic fill without a model; it can only be checked (--weights-check)")]
    Synthetic(PathBuf),
    #[error("manifest tensor {name:?}: {problem}")]
    Tensor { name: String, problem: String },
}

/// What to attach to.
#[derive(Clone, Debug)]
pub struct AttachConfig {
    pub manifest: PathBuf,
    pub scope: String,
    /// The worker's own model file (`-m`); `None` uses the manifest's.
    pub model: Option<PathBuf>,
    /// The owner's token file (a TCP control plane with a token).
    pub token_file: Option<PathBuf>,
}

/// The imported memory.
pub enum Imported {
    Host(Vec<Arc<sys::SealedMap>>),
    /// Shared with the weights a GPU backend binds in place, which keep it
    /// mapped.
    Vmm(Arc<VmmImport>),
}

/// Imported device regions. Fields drop in order: the regions are
/// unmapped before the device releases its context.
pub struct VmmImport {
    pub regions: Vec<vmm::Region>,
    pub device: vmm::Device,
}

/// A live lease with its imported regions.
pub struct Attachment {
    pub manifest: Manifest,
    pub manifest_path: PathBuf,
    pub model_path: PathBuf,
    /// `None` for a synthetic manifest (no model).
    pub file: Option<GgufFile>,
    pub scope: Scope,
    pub lease_id: String,
    pub imported: Imported,
    /// Seconds from reading the manifest to imported regions.
    pub import_seconds: f64,
    keepalive_every: Duration,
    client: ControlClient,
    owner_alive: Arc<AtomicBool>,
}

/// Read, check, attach and import. Control-plane calls run on `rt`; the
/// import runs on the calling thread (a CUDA context is per thread).
pub fn attach(
    cfg: &AttachConfig,
    rt: &tokio::runtime::Runtime,
) -> Result<Attachment, WeightsError> {
    let t0 = Instant::now();
    let manifest = Manifest::read(&cfg.manifest)?;
    let mpath = cfg.manifest.clone();
    if !pid_alive(manifest.owner.pid) {
        return Err(WeightsError::OwnerGone {
            pid: manifest.owner.pid,
            manifest: mpath,
        });
    }
    if let Some(rank) = manifest.rank.filter(|r| !r.is_whole()) {
        return Err(WeightsError::OneRank {
            manifest: mpath,
            rank,
        });
    }
    let scope = manifest
        .scope(&cfg.scope)
        .cloned()
        .ok_or_else(|| WeightsError::NoScope {
            manifest: mpath.clone(),
            scope: cfg.scope.clone(),
            have: manifest
                .scopes
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let owner_model = manifest
        .model
        .shards
        .first()
        .map(|s| s.path.clone())
        .unwrap_or_default();
    let model_path = cfg.model.clone().unwrap_or_else(|| owner_model.clone());
    let synthetic = manifest.model.family == layout::SYNTHETIC_FAMILY;
    let (file, identity) = if synthetic {
        (None, manifest.model.layout_identity.clone())
    } else {
        let file = GgufFile::open(&model_path).map_err(|error| WeightsError::Open {
            path: model_path.clone(),
            error,
        })?;
        let identity = layout::gguf::layout_identity(&file);
        if identity != manifest.model.layout_identity {
            return Err(WeightsError::Identity {
                model: model_path,
                model_identity: identity,
                manifest: mpath,
                manifest_identity: manifest.model.layout_identity.clone(),
                owner_model,
            });
        }
        (Some(file), identity)
    };
    // A vmm manifest needs the owner's device here; check before leasing.
    let device = match manifest.backend.kind {
        BackendKind::Host => None,
        BackendKind::Vmm => {
            let uuid = manifest
                .backend
                .device
                .as_ref()
                .map(|d| d.uuid.clone())
                .unwrap_or_default();
            Some(vmm::Device::open_uuid(&uuid).map_err(|e| WeightsError::CannotImport {
                manifest: mpath.clone(),
                backend: BackendKind::Vmm,
                reason: e.to_string(),
                hint: "run this worker on the owner's machine with its GPU visible, or start the owner with --backend host for CPU workers",
            })?)
        }
    };

    let token = cfg
        .token_file
        .as_deref()
        .map(Token::read_file)
        .transpose()?;
    let addr = ControlAddr::parse(&manifest.control.grpc);
    let control_err = |message: String| WeightsError::Control {
        addr: addr.to_string(),
        message,
        manifest: mpath.clone(),
    };
    let (client, lease) = rt.block_on(async {
        let mut client = connect(&addr, BearerAuth::new(token.as_ref()))
            .await
            .map_err(|e| control_err(crate::cli::error_line(&e)))?;
        let r = client
            .attach(pb::AttachRequest {
                worker_id: format!("ds4-server pid {}", std::process::id()),
                pid: std::process::id(),
                scope: cfg.scope.clone(),
                expected_layout_identity: identity.clone(),
            })
            .await
            .map_err(|s| match s.code() {
                tonic::Code::FailedPrecondition
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated => WeightsError::Refused(s.message().to_string()),
                _ => control_err(s.message().to_string()),
            })?;
        Ok::<_, WeightsError>((client, r.into_inner()))
    })?;

    let fds = fetch_fds(&manifest.control.broker, &lease.lease_id)?;
    let imported = import(&scope, fds, device, &manifest.control.broker)?;
    Ok(Attachment {
        manifest,
        manifest_path: mpath,
        model_path,
        file,
        scope,
        lease_id: lease.lease_id,
        imported,
        import_seconds: t0.elapsed().as_secs_f64(),
        keepalive_every: Duration::from_secs_f64(lease.keepalive_interval_s.clamp(0.1, 60.0)),
        client,
        owner_alive: Arc::new(AtomicBool::new(true)),
    })
}

/// Ask the broker for the lease's region fds.
fn fetch_fds(
    path: &Path,
    lease_id: &str,
) -> Result<Vec<(u32, std::os::fd::OwnedFd)>, WeightsError> {
    use std::io::{Read, Write};
    let err = |message: String| WeightsError::Broker {
        path: path.into(),
        message,
    };
    let stream = std::os::unix::net::UnixStream::connect(path).map_err(|e| err(e.to_string()))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| err(e.to_string()))?;
    let mut req = serde_json::to_vec(&FdRequest {
        lease_id: lease_id.into(),
    })
    .expect("request serializes");
    req.push(b'\n');
    (&stream).write_all(&req).map_err(|e| err(e.to_string()))?;
    // Read the reply line byte by byte: a buffered read could swallow the
    // first descriptor message (its fds would be lost).
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        let n = (&stream).read(&mut byte).map_err(|e| err(e.to_string()))?;
        if n == 0 {
            return Err(err("the broker closed the connection".into()));
        }
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    let reply: FdReply =
        serde_json::from_slice(&line).map_err(|e| err(format!("bad reply: {e}")))?;
    if let Some(e) = reply.error {
        return Err(err(format!("refused: {e}")));
    }
    let mut fds = Vec::with_capacity(reply.regions.len());
    for _ in 0..reply.batches {
        (&stream).write_all(b"N").map_err(|e| err(e.to_string()))?;
        fds.extend(sys::recv_fds(&stream).map_err(|e| err(e.to_string()))?);
    }
    if fds.len() != reply.regions.len() {
        return Err(err(format!(
            "received {} descriptors for {} regions",
            fds.len(),
            reply.regions.len()
        )));
    }
    Ok(reply.regions.into_iter().zip(fds).collect())
}

fn import(
    scope: &Scope,
    fds: Vec<(u32, std::os::fd::OwnedFd)>,
    device: Option<vmm::Device>,
    broker: &Path,
) -> Result<Imported, WeightsError> {
    let mut by_id: std::collections::HashMap<u32, std::os::fd::OwnedFd> = fds.into_iter().collect();
    let mut take = |id: u32| {
        by_id.remove(&id).ok_or_else(|| WeightsError::Broker {
            path: broker.into(),
            message: format!("no descriptor for region {id}"),
        })
    };
    match device {
        None => {
            let mut maps = Vec::with_capacity(scope.regions.len());
            for r in &scope.regions {
                let fd = take(r.id)?;
                let map = sys::map_sealed(&fd, r.bytes).map_err(|e| WeightsError::Import {
                    region: r.id,
                    message: e.to_string(),
                })?;
                maps.push(Arc::new(map));
            }
            Ok(Imported::Host(maps))
        }
        Some(device) => {
            let mut regions = Vec::with_capacity(scope.regions.len());
            for r in &scope.regions {
                let fd = take(r.id)?;
                let imported =
                    device
                        .import(fd.as_fd(), r.bytes)
                        .map_err(|e| WeightsError::Import {
                            region: r.id,
                            message: e.to_string(),
                        })?;
                regions.push(imported);
            }
            Ok(Imported::Vmm(Arc::new(VmmImport { regions, device })))
        }
    }
}

fn entry_checked<'a>(
    scope: &'a Scope,
    t: &TensorInfo,
    index: &std::collections::HashMap<&str, usize>,
) -> Result<&'a TensorEntry, WeightsError> {
    let problem = |p: String| WeightsError::Tensor {
        name: t.name.clone(),
        problem: p,
    };
    let e = index
        .get(t.name.as_str())
        .map(|&i| &scope.tensors[i])
        .ok_or_else(|| problem("missing from the manifest".into()))?;
    if e.layout != ds4_proto::manifest::LAYOUT_GGUF {
        return Err(problem(format!(
            "layout {:?} is unknown to this worker (it reads {:?})",
            e.layout,
            ds4_proto::manifest::LAYOUT_GGUF
        )));
    }
    if e.bytes != t.n_bytes || e.ggml_type != t.ggml_type.id() || e.shape != t.shape {
        return Err(problem(format!(
            "manifest has type {} shape {:?} {} bytes, the model file type {} shape {:?} {} bytes",
            e.ggml_type,
            e.shape,
            e.bytes,
            t.ggml_type.id(),
            t.shape,
            t.n_bytes
        )));
    }
    Ok(e)
}

impl Attachment {
    /// Host memory views of every tensor (host backend only).
    pub fn host_bytes(&self) -> Result<std::collections::HashMap<String, HostBytes>, WeightsError> {
        let Imported::Host(maps) = &self.imported else {
            return Err(WeightsError::CannotImport {
                manifest: self.manifest_path.clone(),
                backend: BackendKind::Vmm,
                reason: "the CPU compute backend cannot read device memory".into(),
                hint: "serving from vmm regions needs the CUDA compute backend; start the owner with --backend host for CPU workers",
            });
        };
        self.per_tensor(|e| {
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = maps.get(e.region as usize)?.clone();
            HostBytes::new(owner, e.offset as usize, e.bytes as usize)
        })
    }

    /// For a `vmm` attachment: every tensor's bytes in device memory, bound
    /// in place by the CUDA backend (the weights keep the regions mapped).
    /// Empty for a `host` attachment.
    pub fn device_bytes(
        &self,
    ) -> Result<std::collections::HashMap<String, DeviceBytes>, WeightsError> {
        let Imported::Vmm(v) = &self.imported else {
            return Ok(std::collections::HashMap::new());
        };
        self.per_tensor(|e| {
            let owner: Arc<dyn std::any::Any + Send + Sync> = v.clone();
            v.regions
                .get(e.region as usize)?
                .device_bytes(e.offset, e.bytes, owner)
        })
    }

    /// `place` applied to every tensor of the model file's scope entry;
    /// `None` means the entry does not fit its region.
    fn per_tensor<T>(
        &self,
        place: impl Fn(&TensorEntry) -> Option<T>,
    ) -> Result<std::collections::HashMap<String, T>, WeightsError> {
        let file = self.model_file()?;
        let index: std::collections::HashMap<&str, usize> = self
            .scope
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut out = std::collections::HashMap::new();
        for t in file.tensors() {
            let e = entry_checked(&self.scope, t, &index)?;
            let placed = place(e).ok_or_else(|| WeightsError::Tensor {
                name: t.name.clone(),
                problem: format!(
                    "offset {} + {} bytes lies outside region {} (or the region is missing)",
                    e.offset, e.bytes, e.region
                ),
            })?;
            out.insert(t.name.clone(), placed);
        }
        Ok(out)
    }

    /// Compare up to `sample` bytes at the start and end of every tensor
    /// in the imported memory with the model file; returns the bytes
    /// compared.
    pub fn verify(&self, sample: usize) -> Result<u64, WeightsError> {
        let Some(file) = &self.file else {
            return self.verify_synthetic(sample);
        };
        let index: std::collections::HashMap<&str, usize> = self
            .scope
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.as_str(), i))
            .collect();
        let mut compared = 0u64;
        let mut buf = vec![0u8; sample];
        for t in file.tensors() {
            let e = entry_checked(&self.scope, t, &index)?;
            let want = file.tensor_data(t);
            let n = want.len().min(sample);
            for start in [0, want.len() - n] {
                let got: &[u8] = match &self.imported {
                    Imported::Host(maps) => {
                        let at = e.offset as usize + start;
                        &(*maps[e.region as usize]).as_ref()[at..at + n]
                    }
                    Imported::Vmm(v) => {
                        let (device, regions) = (&v.device, &v.regions);
                        device
                            .read(
                                &regions[e.region as usize],
                                e.offset + start as u64,
                                &mut buf[..n],
                            )
                            .map_err(|err| WeightsError::Import {
                                region: e.region,
                                message: err.to_string(),
                            })?;
                        &buf[..n]
                    }
                };
                if got != &want[start..start + n] {
                    return Err(WeightsError::Tensor {
                        name: t.name.clone(),
                        problem: format!("imported bytes at {start} differ from the model file"),
                    });
                }
                compared += n as u64;
            }
        }
        Ok(compared)
    }

    /// The model file (absent for a synthetic manifest).
    pub fn model_file(&self) -> Result<&GgufFile, WeightsError> {
        self.file
            .as_ref()
            .ok_or_else(|| WeightsError::Synthetic(self.manifest_path.clone()))
    }

    /// Check `sample` bytes at the start, middle and end of every region
    /// against the synthetic pattern.
    fn verify_synthetic(&self, sample: usize) -> Result<u64, WeightsError> {
        let mut buf = vec![0u8; sample];
        let mut compared = 0u64;
        for (i, r) in self.scope.regions.iter().enumerate() {
            let n = (r.bytes as usize).min(sample);
            let mid = (r.bytes / 2) & !255;
            for start in [0, mid, r.bytes - n as u64] {
                let got: &[u8] = match &self.imported {
                    Imported::Host(maps) => {
                        &(*maps[i]).as_ref()[start as usize..start as usize + n]
                    }
                    Imported::Vmm(v) => {
                        let (device, regions) = (&v.device, &v.regions);
                        device
                            .read(&regions[i], start, &mut buf[..n])
                            .map_err(|err| WeightsError::Import {
                                region: r.id,
                                message: err.to_string(),
                            })?;
                        &buf[..n]
                    }
                };
                if let Some(k) =
                    (0..n).find(|&k| got[k] != layout::synthetic_byte(r.id, start + k as u64))
                {
                    return Err(WeightsError::Import {
                        region: r.id,
                        message: format!(
                            "byte {} differs from the synthetic pattern",
                            start + k as u64
                        ),
                    });
                }
                compared += n as u64;
            }
        }
        Ok(compared)
    }

    pub fn backend(&self) -> BackendKind {
        self.manifest.backend.kind
    }

    pub fn region_count(&self) -> usize {
        self.scope.regions.len()
    }

    pub fn region_bytes(&self) -> u64 {
        self.scope.regions.iter().map(|r| r.bytes).sum()
    }

    /// `false` once keep-alives found the owner gone.
    pub fn owner_alive(&self) -> Arc<AtomicBool> {
        self.owner_alive.clone()
    }

    /// Send keep-alives on `rt` until the owner is gone.
    pub fn spawn_keepalive(&self, rt: &tokio::runtime::Runtime) {
        let mut client = self.client.clone();
        let lease_id = self.lease_id.clone();
        let every = self.keepalive_every;
        let alive = self.owner_alive.clone();
        let pid = self.manifest.owner.pid;
        rt.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let r = client
                    .keep_alive(pb::KeepAliveRequest {
                        lease_id: lease_id.clone(),
                    })
                    .await;
                match r {
                    Ok(_) => {}
                    Err(s) if s.code() == tonic::Code::NotFound => {
                        tracing::warn!(lease_id = %lease_id, "the weight owner no longer knows this lease ({}); serving on with the imported weights", s.message());
                        return;
                    }
                    Err(s) => {
                        if !pid_alive(pid) || s.code() == tonic::Code::Unavailable {
                            alive.store(false, Ordering::Relaxed);
                            tracing::warn!(
                                lease_id = %lease_id,
                                owner_pid = pid,
                                "weight owner is gone ({}); serving on with the imported weights, which stay valid; restart ds4-weight-server and then this worker to reattach",
                                s.message()
                            );
                            return;
                        }
                        tracing::warn!(lease_id = %lease_id, "keep-alive failed: {}", s.message());
                    }
                }
            }
        });
    }

    /// End the lease (clean shutdown); errors are ignored.
    pub async fn detach(&self) {
        let mut client = self.client.clone();
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            client.detach(pb::DetachRequest {
                lease_id: self.lease_id.clone(),
            }),
        )
        .await;
    }
}

/// Owned copies of the regions, planned exactly as the owner plans host
/// regions: the standalone path. Returns every tensor's bytes.
pub fn standalone(file: &GgufFile) -> std::collections::HashMap<String, HostBytes> {
    let plan = layout::gguf::plan(file, HOST_GRANULARITY, MAX_REGION_BYTES);
    let mut regions: Vec<Vec<u8>> = plan
        .region_bytes
        .iter()
        .map(|&b| vec![0u8; b as usize])
        .collect();
    for (t, p) in file.tensors().iter().zip(&plan.placements) {
        let at = p.offset as usize;
        regions[p.region as usize][at..at + t.n_bytes as usize]
            .copy_from_slice(file.tensor_data(t));
    }
    let regions: Vec<Arc<dyn AsRef<[u8]> + Send + Sync>> = regions
        .into_iter()
        .map(|r| Arc::new(r) as Arc<dyn AsRef<[u8]> + Send + Sync>)
        .collect();
    file.tensors()
        .iter()
        .zip(&plan.placements)
        .map(|(t, p)| {
            let bytes = HostBytes::new(
                regions[p.region as usize].clone(),
                p.offset as usize,
                t.n_bytes as usize,
            )
            .expect("the plan keeps every tensor inside its region");
            (t.name.clone(), bytes)
        })
        .collect()
}
