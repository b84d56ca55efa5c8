//! The worker's weight flags (where the weights come from, how they are
//! checked) and the lease's life in a serving process.

use std::path::PathBuf;
use std::sync::atomic::Ordering;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args};
use ds4_kernels::Backend;
use ds4_proto::manifest::{BackendKind, SCOPE_BASE};

use super::{attach, AttachConfig, Attachment};
use crate::runtime::LoadedModel;

/// Flags of a worker about its weights: the weight owner to take them
/// from, and their check.
#[derive(Args, Debug, Clone)]
pub struct WeightsArgs {
    /// Attach to the weight owner that published this manifest instead of
    /// loading the model (env also DS4_CUDA_WEIGHT_IPC_MANIFEST). With -m,
    /// the model file's layout identity must match the manifest's; without,
    /// the owner's model file is used for metadata and tokenizer.
    #[arg(long, env = "DS4_WEIGHT_MANIFEST")]
    pub weights_manifest: Option<PathBuf>,
    /// Manifest scope to attach (env also DS4_CUDA_WEIGHT_IPC_SCOPE).
    #[arg(long, env = "DS4_WEIGHT_SCOPE")]
    pub weights_scope: Option<String>,
    /// Attach, import and verify the weights (a sample of every tensor is
    /// compared with the model file), print the timing, detach and exit.
    #[arg(long, env = "DS4_WEIGHT_CHECK", requires = "weights_manifest")]
    pub weights_check: bool,
    /// The owner's token file, when its control plane is on TCP with
    /// --grpc-token-file (the same file and variable as the owner's).
    #[arg(long, env = "DS4_WEIGHT_GRPC_TOKEN_FILE")]
    pub grpc_token_file: Option<PathBuf>,
    /// Before serving, scan every tensor for NaN or infinite values and
    /// block scales (reads all the weights; a bad one is refused, naming
    /// the tensor and its first bad block).
    #[arg(long, env = "DS4_CHECK_TENSORS")]
    pub check_tensors: bool,
}

/// A live lease: its runtime (keep-alives) and imported memory. Dropping
/// it detaches.
pub struct WeightsSession {
    rt: tokio::runtime::Runtime,
    pub attachment: Attachment,
}

impl WeightsSession {
    /// `false` once the owner was found gone.
    pub fn owner_alive(&self) -> bool {
        self.attachment.owner_alive().load(Ordering::Relaxed)
    }

    /// The shared flag behind [`Self::owner_alive`], for status reporting.
    pub fn owner_alive_flag(&self) -> std::sync::Arc<std::sync::atomic::AtomicBool> {
        self.attachment.owner_alive()
    }
}

impl Drop for WeightsSession {
    fn drop(&mut self) {
        self.rt.block_on(self.attachment.detach());
    }
}

/// The model path given explicitly (`-m` or `DS4_MODEL`), not defaulted.
pub fn explicit_model(matches: &ArgMatches, id: &str) -> Option<PathBuf> {
    match matches.value_source(id) {
        Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable) => {
            matches.get_one::<PathBuf>(id).cloned()
        }
        _ => None,
    }
}

impl WeightsArgs {
    /// The manifest and scope, from the flags or the legacy variables.
    pub fn config(&self, model: Option<PathBuf>) -> Option<AttachConfig> {
        let manifest = self
            .weights_manifest
            .clone()
            .or_else(|| std::env::var_os("DS4_CUDA_WEIGHT_IPC_MANIFEST").map(PathBuf::from))
            .filter(|p| !p.as_os_str().is_empty())?;
        let scope = self
            .weights_scope
            .clone()
            .or_else(|| std::env::var("DS4_CUDA_WEIGHT_IPC_SCOPE").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| SCOPE_BASE.to_string());
        Some(AttachConfig {
            manifest,
            scope,
            model,
            token_file: self.grpc_token_file.clone(),
        })
    }

    /// Attach, import and verify, then detach; the report line.
    pub fn check(&self, explicit_model: Option<PathBuf>) -> anyhow::Result<String> {
        let cfg = self
            .config(explicit_model)
            .ok_or_else(|| anyhow::anyhow!("--weights-check needs --weights-manifest"))?;
        let session = self.session(&cfg)?;
        let att = &session.attachment;
        let t = std::time::Instant::now();
        let compared = att.verify(4096)?;
        Ok(format!(
            "weights imported backend={} regions={} bytes={} import_ms={:.1} verified_bytes={} verify_ms={:.1} verify=ok",
            att.backend(),
            att.region_count(),
            att.region_bytes(),
            att.import_seconds * 1e3,
            compared,
            t.elapsed().as_secs_f64() * 1e3
        ))
    }

    fn session(&self, cfg: &AttachConfig) -> anyhow::Result<WeightsSession> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("weights-lease")
            .enable_all()
            .build()?;
        let attachment = attach(cfg, &rt)?;
        tracing::info!(
            manifest = %cfg.manifest.display(),
            scope = %cfg.scope,
            lease_id = %attachment.lease_id,
            owner_pid = attachment.manifest.owner.pid,
            generation = attachment.manifest.owner.generation,
            backend = %attachment.backend(),
            regions = attachment.region_count(),
            bytes = attachment.region_bytes(),
            import_ms = format!("{:.1}", attachment.import_seconds * 1e3),
            "weights imported from the owner"
        );
        Ok(WeightsSession { rt, attachment })
    }

    /// Load the model: attached when a manifest is configured (the lease
    /// is kept alive until the session is dropped), else standalone from
    /// `model_path`.
    pub fn load<B: Backend>(
        &self,
        model_path: &std::path::Path,
        explicit_model: Option<PathBuf>,
        backend: B,
        model_id: Option<String>,
    ) -> anyhow::Result<(LoadedModel<B>, Option<WeightsSession>)> {
        let Some(cfg) = self.config(explicit_model) else {
            let lm = LoadedModel::open_with(model_path, backend, model_id, self.check_tensors)?;
            return Ok((lm, None));
        };
        let session = self.session(&cfg)?;
        if session.attachment.backend() == BackendKind::Vmm && !backend.device_resident() {
            let compared = session.attachment.verify(4096)?;
            anyhow::bail!(
                "vmm weights were imported and verified ({compared} sample bytes match the model file), but this worker computes on the CPU, which cannot read device memory; start it with --device cuda (needs a usable GPU), or start the owner with --backend host for CPU workers"
            );
        }
        let lm = LoadedModel::attached(&session.attachment, backend, model_id, self.check_tensors)?;
        session.attachment.spawn_keepalive(&session.rt);
        Ok((lm, Some(session)))
    }
}
