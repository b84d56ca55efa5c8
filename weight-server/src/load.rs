//! Open, validate, plan, allocate and upload: everything the owner does
//! before it can publish a manifest.

use std::path::{Path, PathBuf};

use ds4_kernels::vmm;
use ds4_kernels::CpuBackend;
use ds4_model::gguf::GgufFile;
use ds4_model::{Family, Model, ModelError};
use ds4_proto::layout::rank::Rank;
use ds4_proto::layout::{self, ContentHasher, Plan, HOST_GRANULARITY, MAX_REGION_BYTES};
use ds4_proto::manifest::{ModelEntry, RegionEntry, Scope};

use crate::backend::{self, BackendError, Store};
use crate::plan;
use crate::progress::Progress;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file is missing, not a regular file, damaged, or (with
    /// `--check-tensors`) holds non-finite weights.
    #[error("{}", error.report(path, "check --base (DS4_WEIGHT_BASE)"))]
    Open {
        path: PathBuf,
        error: ds4_model::gguf::GgufError,
    },
    #[error("model {path} is not supported: {source}")]
    Unsupported { path: PathBuf, source: ModelError },
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// Which backend to place weights in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendChoice {
    Vmm,
    Host,
}

impl BackendChoice {
    /// `vmm` when a CUDA device is usable, else `host`.
    pub fn detect() -> BackendChoice {
        if vmm::usable() {
            BackendChoice::Vmm
        } else {
            BackendChoice::Host
        }
    }
}

/// Open the model and check it against its family contract. The check
/// binds views of the file mapping to the CPU reference backend; no weight
/// memory is allocated. With `check_tensors`, every tensor's data is
/// scanned for non-finite values and block scales too.
pub fn open_and_validate(
    path: &Path,
    check_tensors: bool,
) -> Result<(GgufFile, Family), LoadError> {
    let open_error = |error| LoadError::Open {
        path: path.into(),
        error,
    };
    let file = GgufFile::open(path).map_err(open_error)?;
    let unsupported = |source| LoadError::Unsupported {
        path: path.into(),
        source,
    };
    let family = ds4_model::families::detect(&file).map_err(unsupported)?;
    Model::load(&file, &CpuBackend::new()).map_err(unsupported)?;
    if check_tensors {
        let t0 = std::time::Instant::now();
        ds4_model::gguf::check_tensors(&file).map_err(open_error)?;
        tracing::info!(
            tensors = file.tensors().len(),
            bytes = file.tensor_bytes(),
            check_s = format!("{:.2}", t0.elapsed().as_secs_f64()),
            "tensors checked: every value and block scale is finite"
        );
    }
    Ok((file, family))
}

/// The model entry of the manifest, without the content identity.
pub fn model_entry(file: &GgufFile, family: Family) -> ModelEntry {
    ModelEntry {
        family: family.name().to_string(),
        architecture: file.architecture().unwrap_or_default().to_string(),
        shards: plan::shard_entries(file),
        layout_identity: layout::gguf::layout_identity(file),
        content_identity: String::new(),
    }
}

/// The plan of what `rank` holds, for a backend's granularity.
pub fn plan_for(file: &GgufFile, rank: Rank, granularity: u64) -> Plan {
    layout::gguf::plan_rank(file, rank, granularity, MAX_REGION_BYTES)
}

/// The result of a load.
pub struct Loaded {
    pub model: ModelEntry,
    pub scope: Scope,
    pub store: Store,
}

/// Allocate the regions of `plan` in `store` and upload every tensor,
/// hashing the bytes on the way (the content identity).
pub fn upload(
    file: &GgufFile,
    family: Family,
    rank: Rank,
    plan: &Plan,
    mut store: Store,
    progress: &mut Progress<'_>,
) -> Result<Loaded, LoadError> {
    let parts = layout::gguf::parts(file, rank);
    const CHUNK: usize = 16 << 20;
    // The content identity is hashed on its own thread while this one
    // writes the same chunks into the regions.
    let content_identity = std::thread::scope(|s| -> Result<String, LoadError> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<&[u8]>(8);
        let hasher = s.spawn(move || {
            let mut h = ContentHasher::new();
            for chunk in rx {
                h.update(chunk);
            }
            h.finish()
        });
        for ((t, p), part) in file.tensors().iter().zip(&plan.placements).zip(&parts) {
            let data = &file.tensor_data(t)[part.bytes.start as usize..part.bytes.end as usize];
            let mut at = p.offset;
            for chunk in data.chunks(CHUNK) {
                tx.send(chunk)
                    .expect("the hasher runs until the sender is dropped");
                store.write(p.region, at, chunk)?;
                at += chunk.len() as u64;
                progress.add(chunk.len() as u64);
            }
        }
        drop(tx);
        Ok(hasher.join().expect("hasher thread"))
    })?;
    store.finish()?;
    progress.finish();
    let mut model = model_entry(file, family);
    model.content_identity = content_identity;
    let scope = Scope {
        regions: region_entries(plan),
        tensors: plan::tensor_entries(file, rank, plan),
    };
    Ok(Loaded {
        model,
        scope,
        store,
    })
}

/// Fill `regions` regions of `region_bytes` each with the synthetic
/// pattern (device import measurements; no model).
pub fn upload_synthetic(
    plan: &Plan,
    mut store: Store,
    progress: &mut Progress<'_>,
) -> Result<Loaded, LoadError> {
    use layout::{synthetic_byte, synthetic_identity, SYNTHETIC_FAMILY};
    const CHUNK: usize = 64 << 20;
    for (r, &bytes) in plan.region_bytes.iter().enumerate() {
        let chunk: Vec<u8> = (0..CHUNK as u64)
            .map(|o| synthetic_byte(r as u32, o))
            .collect();
        let mut at = 0u64;
        while at < bytes {
            let n = (bytes - at).min(CHUNK as u64) as usize;
            store.write(r as u32, at, &chunk[..n])?;
            at += n as u64;
            progress.add(n as u64);
        }
    }
    store.finish()?;
    progress.finish();
    let identity = synthetic_identity(&plan.region_bytes);
    Ok(Loaded {
        model: ModelEntry {
            family: SYNTHETIC_FAMILY.into(),
            architecture: String::new(),
            shards: vec![],
            layout_identity: identity.clone(),
            content_identity: identity,
        },
        scope: Scope {
            regions: region_entries(plan),
            tensors: vec![],
        },
        store,
    })
}

/// The manifest's region list of a plan.
fn region_entries(plan: &Plan) -> Vec<RegionEntry> {
    plan.region_bytes
        .iter()
        .enumerate()
        .map(|(i, &bytes)| RegionEntry {
            id: i as u32,
            bytes,
        })
        .collect()
}

/// A plan of `total` bytes in regions of at most [`MAX_REGION_BYTES`].
pub fn synthetic_plan(total: u64, granularity: u64) -> Plan {
    let g = granularity.max(1);
    let max = MAX_REGION_BYTES / g * g;
    let mut left = total.div_ceil(g) * g;
    let mut region_bytes = Vec::new();
    while left > 0 {
        let b = left.min(max);
        region_bytes.push(b);
        left -= b;
    }
    Plan {
        region_bytes,
        placements: vec![],
    }
}

/// Open the backend's memory and plan for it (allocates nothing yet).
pub enum Target {
    Host,
    Vmm(vmm::Device),
}

impl Target {
    pub fn open(choice: BackendChoice, device: u32) -> Result<Target, LoadError> {
        Ok(match choice {
            BackendChoice::Host => Target::Host,
            BackendChoice::Vmm => {
                Target::Vmm(vmm::Device::open(device).map_err(BackendError::from)?)
            }
        })
    }

    pub fn granularity(&self) -> Result<u64, LoadError> {
        Ok(match self {
            Target::Host => HOST_GRANULARITY,
            Target::Vmm(d) => d.granularity().map_err(BackendError::from)?,
        })
    }

    pub fn memory(&self) -> Result<backend::MemoryView, LoadError> {
        Ok(match self {
            Target::Host => backend::host_memory(),
            Target::Vmm(d) => {
                let (free, total) = d.mem_info().map_err(BackendError::from)?;
                backend::MemoryView {
                    available: free,
                    total,
                    what: "device free",
                }
            }
        })
    }

    pub fn allocate(self, plan: &Plan) -> Result<Store, LoadError> {
        Ok(match self {
            Target::Host => Store::create_host(&plan.region_bytes)?,
            Target::Vmm(d) => Store::create_vmm(d, &plan.region_bytes)?,
        })
    }
}
