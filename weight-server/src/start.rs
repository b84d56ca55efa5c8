//! An owner from its settings to its exit ([`Owner::start`]): validate the
//! model, plan its regions, compare them with the memory (the preflight),
//! refuse a live owner's manifest, allocate, upload with the identities,
//! then serve (`serve.rs`) until a signal or a drain ends it. The
//! binary only parses flags into a [`Config`] and prints what comes back.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use ds4_proto::layout::{
    self,
    rank::{is_routed_experts, Rank},
};
use ds4_proto::manifest::{pid_alive, Manifest, ManifestError, Owner as OwnerEntry, SCOPE_BASE};

use crate::access::{control_access, AccessError};
use crate::dryrun;
use crate::load::{self, BackendChoice, LoadError, Target};
use crate::notify::Notifier;
use crate::owner::Owner;
use crate::progress::Progress;

const GIB: f64 = (1u64 << 30) as f64;

/// The owner's settings, one per flag of `ds4-weight-server`.
#[derive(Clone, Debug)]
pub struct Config {
    /// Model file (GGUF; for a split model, the first shard); `None` for a
    /// synthetic fill.
    pub base: Option<PathBuf>,
    /// Where to publish the manifest; the sockets go beside it by default.
    pub manifest: PathBuf,
    /// `None`: vmm when a CUDA device is usable, else host.
    pub backend: Option<BackendChoice>,
    /// Scope to load (only `base` today).
    pub scope: String,
    /// GiB to leave free on the device (vmm) or host (host) after loading.
    pub reserve_gb: f64,
    /// CUDA device ordinal (vmm).
    pub device: u32,
    /// Control plane address: `unix:PATH` or `HOST:PORT`; `None`: a socket
    /// beside the manifest.
    pub grpc: Option<String>,
    /// Accept a non-loopback TCP `grpc` address (needs `grpc_token_file`).
    pub grpc_allow_remote: bool,
    /// The shared secret every TCP control-plane call must carry.
    pub grpc_token_file: Option<PathBuf>,
    /// fd broker socket path; `None`: beside the manifest.
    pub broker: Option<PathBuf>,
    /// Groups whose members may attach besides the owner's user.
    pub allow_gids: Vec<u32>,
    /// Seconds without a keep-alive after which a lease is reaped.
    pub lease_timeout_s: f64,
    /// Validate, plan and compare with the memory, then stop.
    pub dry_run: bool,
    /// Scan every tensor for non-finite values and block scales before
    /// planning (reads all the weights).
    pub check_tensors: bool,
    /// Instead of a model, fill this many GiB of regions with a known
    /// pattern.
    pub synthetic_gb: Option<f64>,
    /// The part of the model to hold ([`Rank::WHOLE`]: all of it).
    pub rank: Rank,
}

/// How a start ended without an error.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// `dry_run`: the report and whether the weights fit.
    Preflight { report: String, fits: bool },
    /// The model is not supported (logged).
    Unsupported,
    /// Served, then stopped cleanly.
    Stopped,
}

impl Outcome {
    /// The process exit code (`--dry-run`: 0 fits, 1 does not, 2
    /// unsupported).
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Preflight { fits: true, .. } => dryrun::FITS,
            Outcome::Preflight { fits: false, .. } => dryrun::DOES_NOT_FIT,
            Outcome::Unsupported => dryrun::UNSUPPORTED,
            Outcome::Stopped => 0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("scope {found:?} is not supported; this owner loads: {have}", have = SCOPE_BASE)]
    Scope { found: String },
    #[error("--rank {rank}: {path} has no routed experts to split over GPUs; run one owner for the whole model")]
    NothingToSplit { rank: Rank, path: PathBuf },
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Access(#[from] AccessError),
    /// `report` is the preflight report that shows why.
    #[error("the weights do not fit with --reserve-gb {reserve_gb}; see --dry-run")]
    DoesNotFit { reserve_gb: f64, report: String },
    #[error("manifest {path} belongs to a running owner (pid {pid}); stop it first or pick another --manifest")]
    ManifestInUse { path: PathBuf, pid: u32 },
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// Duplicating region descriptors, building the async runtime.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Owner {
    /// Run an owner: load the weights, serve them until a signal or a
    /// drain ends it, then remove the manifest and the sockets. Returns
    /// early with the report for `dry_run`, and when the model is not
    /// supported.
    pub fn start(config: Config) -> Result<Outcome, StartError> {
        let notifier = Notifier::from_env();
        if config.scope != SCOPE_BASE {
            return Err(StartError::Scope {
                found: config.scope,
            });
        }
        let token = control_access(
            &crate::serve::control_addr(&config),
            config.grpc_allow_remote,
            config.grpc_token_file.as_deref(),
        )?;
        let reserve = (config.reserve_gb.max(0.0) * GIB) as u64;
        notifier.status("validating model");
        let model = match &config.base {
            Some(base) => match load::open_and_validate(base, config.check_tensors) {
                Ok(x) => Some(x),
                Err(e) => {
                    tracing::error!("{e}");
                    return Ok(Outcome::Unsupported);
                }
            },
            None => None,
        };
        let choice = config.backend.unwrap_or_else(BackendChoice::detect);
        let target = Target::open(choice, config.device)?;
        if let (Some((file, _)), false) = (&model, config.rank.is_whole()) {
            let split = file.tensors().iter().any(|t| is_routed_experts(&t.name));
            if !split {
                return Err(StartError::NothingToSplit {
                    rank: config.rank,
                    path: config.base.clone().unwrap_or_default(),
                });
            }
        }
        let granularity = target.granularity()?;
        let plan = match &model {
            Some((file, _)) => load::plan_for(file, config.rank, granularity),
            None => load::synthetic_plan(
                (config.synthetic_gb.unwrap_or(0.0).max(0.0) * GIB) as u64,
                granularity,
            ),
        };
        let memory = target.memory()?;
        let backend_name = match choice {
            BackendChoice::Vmm => "vmm",
            BackendChoice::Host => "host",
        };
        let (report, fits) = match &model {
            Some((file, family)) => dryrun::report(
                file,
                family.name(),
                config.rank,
                backend_name,
                &plan,
                &memory,
                reserve,
            ),
            None => dryrun::report_synthetic(backend_name, &plan, &memory, reserve),
        };
        if config.dry_run {
            return Ok(Outcome::Preflight { report, fits });
        }
        if !fits {
            return Err(StartError::DoesNotFit {
                reserve_gb: config.reserve_gb,
                report,
            });
        }
        let generation = next_generation(&config.manifest)?;
        let started_at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        tracing::info!(
            model = %config.base.as_deref().unwrap_or(Path::new("(synthetic)")).display(), backend = backend_name,
            regions = plan.region_bytes.len(), bytes = plan.total_bytes(), "allocating"
        );
        let store = target.allocate(&plan)?;
        let total = model.as_ref().map_or(plan.total_bytes(), |(f, _)| {
            layout::gguf::held_bytes(f, config.rank)
        });
        let mut progress = Progress::new(total, &notifier);
        let t0 = std::time::Instant::now();
        let loaded = match &model {
            Some((file, family)) => {
                load::upload(file, *family, config.rank, &plan, store, &mut progress)?
            }
            None => load::upload_synthetic(&plan, store, &mut progress)?,
        };
        let load_s = t0.elapsed().as_secs_f64();
        tracing::info!(
            bytes = loaded.store.bytes_resident(), load_s = format!("{load_s:.2}"),
            content_identity = %loaded.model.content_identity, "weights uploaded"
        );
        let owner = OwnerEntry {
            pid: std::process::id(),
            started_at,
            generation,
            program_version: env!("CARGO_PKG_VERSION").into(),
        };
        crate::serve::serve(&config, &notifier, loaded, owner, backend_name, token)?;
        tracing::info!("stopped");
        Ok(Outcome::Stopped)
    }
}

/// The generation to publish: one past the manifest already at `path`
/// (1 when there is none). Refuses the manifest of a live owner.
fn next_generation(path: &Path) -> Result<u64, StartError> {
    let Ok(old) = Manifest::read(path) else {
        return Ok(1);
    };
    if old.owner.pid != std::process::id() && pid_alive(old.owner.pid) {
        return Err(StartError::ManifestInUse {
            path: path.into(),
            pid: old.owner.pid,
        });
    }
    Ok(old.owner.generation + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> Config {
        Config {
            base: None,
            manifest: dir.join("weights.json"),
            backend: Some(BackendChoice::Host),
            scope: SCOPE_BASE.into(),
            reserve_gb: 0.0,
            device: 0,
            grpc: None,
            grpc_allow_remote: false,
            grpc_token_file: None,
            broker: None,
            allow_gids: vec![],
            lease_timeout_s: 10.0,
            dry_run: true,
            check_tensors: false,
            synthetic_gb: Some(0.001),
            rank: Rank::WHOLE,
        }
    }

    #[test]
    fn preflight_reports_without_allocating() {
        let dir = tempfile::tempdir().unwrap();
        let out = Owner::start(config(dir.path())).unwrap();
        let Outcome::Preflight { report, fits } = &out else {
            panic!("{out:?}");
        };
        assert!(report.contains("synthetic pattern") && *fits, "{report}");
        assert_eq!(out.exit_code(), dryrun::FITS);
        assert!(!dir.path().join("weights.json").exists());
    }

    #[test]
    fn refuses_an_unknown_scope_and_too_large_a_reserve() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path());
        c.scope = "mtp".into();
        let e = Owner::start(c).unwrap_err();
        assert_eq!(
            e.to_string(),
            "scope \"mtp\" is not supported; this owner loads: base"
        );
        let mut c = config(dir.path());
        c.dry_run = false;
        c.reserve_gb = 1e12;
        let e = Owner::start(c).unwrap_err();
        assert!(
            matches!(&e, StartError::DoesNotFit { report, .. } if report.contains("DOES NOT FIT")),
            "{e}"
        );
    }

    #[test]
    fn refuses_the_manifest_of_a_live_owner() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("weights.json");
        assert_eq!(next_generation(&path).unwrap(), 1);
        // pid 1 is always alive, and is not this test.
        let mut text: serde_json::Value = serde_json::json!({
            "schema": ds4_proto::manifest::SCHEMA,
            "owner": {"pid": 1, "started_at": 0, "generation": 4, "program_version": "x"},
            "model": {"family": "f", "architecture": "a", "shards": [], "layout_identity": "", "content_identity": ""},
            "backend": {"kind": "host"},
            "control": {"grpc": "unix:/x", "broker": "/y"},
            "scopes": {}
        });
        std::fs::write(&path, text.to_string()).unwrap();
        let e = next_generation(&path).unwrap_err();
        assert!(e.to_string().contains("(pid 1)"), "{e}");
        // An owner that is gone: its manifest is replaced, one generation on.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        text["owner"]["pid"] = child.id().into();
        child.wait().unwrap();
        std::fs::write(&path, text.to_string()).unwrap();
        assert_eq!(next_generation(&path).unwrap(), 5);
    }
}
