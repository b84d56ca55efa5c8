//! A model ready to serve: the mapped GGUF, its family model bound to a
//! backend, and its chat layer (the family's chat protocol and the
//! tokenizer). Weights are bound either
//! to regions this process placed (standalone) or to regions imported from
//! the weight owner ([`crate::weights`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use ds4_kernels::Backend;
use ds4_model::chat::Chat;
use ds4_model::gguf::GgufFile;
use ds4_model::tokenizer::Tokenizer;
use ds4_model::{Model, ModelError};

use crate::weights::Attachment;

/// What to do when the model file does not exist.
const IF_MISSING: &str = "run ./scripts/fetch-model.sh for the default model, or pass -m PATH";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file is missing, not a regular file, damaged, or (with
    /// `--check-tensors`) holds non-finite weights.
    #[error("{}", error.report(path, IF_MISSING))]
    Open {
        path: PathBuf,
        error: ds4_model::gguf::GgufError,
    },
    #[error("model {path}: {source}")]
    Model { path: PathBuf, source: ModelError },
    #[error("model {path}: tokenizer: {source}")]
    Tokenizer {
        path: PathBuf,
        source: ds4_model::tokenizer::TokenizerError,
    },
    #[error("model {path}: weights: {source}")]
    Weights {
        path: PathBuf,
        source: Box<crate::weights::WeightsError>,
    },
    #[error("model {path}: chat template: {source}")]
    Template {
        path: PathBuf,
        source: ds4_model::chat::PromptError,
    },
}

pub struct LoadedModel<B: Backend> {
    pub backend: B,
    pub model: Model<B>,
    /// The family's chat protocol and the tokenizer.
    pub chat: Chat,
    /// The id clients see in `/v1/models` and responses.
    pub model_id: String,
    pub path: PathBuf,
    /// Seconds spent opening, validating and binding.
    pub load_seconds: f64,
    /// What a saved KV state is valid for: the tensor layout and a sample
    /// of every tensor's bytes (so a fine-tune of the same layout differs).
    pub kv_identity: String,
}

/// Where a model's weight bytes come from.
pub enum WeightBytes<'a> {
    /// Placed by this process: the owner's region plan, filled from the
    /// file (byte-identical to what an owner would hold).
    Standalone,
    /// Imported from the weight owner.
    Attached(&'a Attachment),
}

impl<B: Backend> LoadedModel<B> {
    /// Load `path` standalone.
    pub fn open(
        path: &Path,
        backend: B,
        model_id: Option<String>,
    ) -> Result<LoadedModel<B>, LoadError> {
        Self::open_with(path, backend, model_id, false)
    }

    /// Load `path` standalone; with `check_tensors`, refuse weights with a
    /// non-finite value or block scale.
    pub fn open_with(
        path: &Path,
        backend: B,
        model_id: Option<String>,
        check_tensors: bool,
    ) -> Result<LoadedModel<B>, LoadError> {
        let t0 = Instant::now();
        let file = GgufFile::open(path).map_err(|error| LoadError::Open {
            path: path.into(),
            error,
        })?;
        let weights = WeightBytes::Standalone;
        Self::bind(&file, path, weights, backend, model_id, check_tensors, t0)
    }

    /// Bind to the weights of an attachment (no copy); the attachment's
    /// model file supplies metadata, tokenizer and template. With
    /// `check_tensors`, the bytes bound are checked first (for device
    /// regions, the model file's, which the owner uploaded).
    pub fn attached(
        att: &Attachment,
        backend: B,
        model_id: Option<String>,
        check_tensors: bool,
    ) -> Result<LoadedModel<B>, LoadError> {
        let t0 = Instant::now();
        let file = att.model_file().map_err(|source| LoadError::Weights {
            path: att.manifest_path.clone(),
            source: Box::new(source),
        })?;
        Self::bind(
            file,
            &att.model_path,
            WeightBytes::Attached(att),
            backend,
            model_id,
            check_tensors,
            t0,
        )
    }

    fn bind(
        file: &GgufFile,
        path: &Path,
        weights: WeightBytes<'_>,
        backend: B,
        model_id: Option<String>,
        check_tensors: bool,
        t0: Instant,
    ) -> Result<LoadedModel<B>, LoadError> {
        // Validate before placing any bytes.
        let family = ds4_model::families::detect(file).map_err(|source| LoadError::Model {
            path: path.into(),
            source,
        })?;
        // Where the bytes come from: a device backend reads the file's own
        // mapping (it uploads) or binds the owner's device regions in place;
        // the CPU backend computes from host regions placed like the owner's.
        let file_mapping = || {
            let src = ds4_model::families::TensorSource::from_file(file);
            file.tensors()
                .iter()
                .map(|t| (t.name.clone(), src.bytes(t)))
                .collect()
        };
        let weights_error = |source| LoadError::Weights {
            path: path.into(),
            source: Box::new(source),
        };
        let mut device = std::collections::HashMap::new();
        let bytes = match weights {
            WeightBytes::Standalone if backend.device_resident() => file_mapping(),
            WeightBytes::Standalone => crate::weights::standalone(file),
            WeightBytes::Attached(att) if backend.device_resident() => {
                device = att.device_bytes().map_err(weights_error)?;
                if device.is_empty() {
                    att.host_bytes().map_err(weights_error)?
                } else {
                    file_mapping()
                }
            }
            WeightBytes::Attached(att) => att.host_bytes().map_err(weights_error)?,
        };
        if check_tensors {
            check(file, path, &bytes)?;
        }
        let kv_identity = kv_identity(file, &bytes);
        let model = Model::load_with(
            file,
            &backend,
            |t| {
                bytes
                    .get(&t.name)
                    .cloned()
                    .ok_or("no bytes were placed for this tensor")
            },
            device,
        )
        .map_err(|source| LoadError::Model {
            path: path.into(),
            source,
        })?;
        let tokenizer =
            Tokenizer::from_gguf(file.metadata()).map_err(|source| LoadError::Tokenizer {
                path: path.into(),
                source,
            })?;
        let protocol =
            family
                .chat_protocol(file.metadata())
                .map_err(|source| LoadError::Template {
                    path: path.into(),
                    source,
                })?;
        let model_id = model_id.unwrap_or_else(|| model_id_from_path(path));
        let chat = Chat::new(Arc::new(tokenizer), protocol);
        Ok(LoadedModel {
            backend,
            model,
            chat,
            model_id,
            path: path.to_path_buf(),
            load_seconds: t0.elapsed().as_secs_f64(),
            kv_identity,
        })
    }
}

/// `--check-tensors`: every tensor's bound bytes scanned for non-finite
/// values and block scales.
fn check(
    file: &GgufFile,
    path: &Path,
    bytes: &std::collections::HashMap<String, ds4_kernels::HostBytes>,
) -> Result<(), LoadError> {
    let t0 = Instant::now();
    for t in file.tensors() {
        if let Some(b) = bytes.get(&t.name) {
            ds4_model::gguf::check_tensor(t, b.as_slice()).map_err(|error| LoadError::Open {
                path: path.into(),
                error,
            })?;
        }
    }
    tracing::info!(
        tensors = file.tensors().len(),
        check_s = format!("{:.2}", t0.elapsed().as_secs_f64()),
        "tensors checked: every value and block scale is finite"
    );
    Ok(())
}

/// The model identity saved KV state is checked against: the layout
/// identity plus a hash of the first and last 4 KiB of every tensor.
fn kv_identity(
    file: &GgufFile,
    bytes: &std::collections::HashMap<String, ds4_kernels::HostBytes>,
) -> String {
    use sha2::{Digest, Sha256};
    const SAMPLE: usize = 4096;
    let mut h = Sha256::new();
    for t in file.tensors() {
        h.update(t.name.as_bytes());
        if let Some(b) = bytes.get(&t.name) {
            let b = b.as_slice();
            h.update(&b[..b.len().min(SAMPLE)]);
            h.update(&b[b.len().saturating_sub(SAMPLE)..]);
        }
    }
    let sampled: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}+{sampled}",
        ds4_proto::layout::gguf::layout_identity(file)
    )
}

/// The model id derived from a file name: the resolved file's stem
/// (`./ds4.gguf -> SmolLM2-135M-Instruct.Q4_1`).
pub fn model_id_from_path(path: &Path) -> String {
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let stem = resolved
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model");
    // Split models: drop the -00001-of-0000N suffix.
    match stem.rsplit_once("-of-") {
        Some((head, tail)) if tail.len() == 5 && tail.bytes().all(|b| b.is_ascii_digit()) => {
            head.rsplit_once('-').map_or(stem, |(h, _)| h).to_string()
        }
        _ => stem.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_id_strips_extension_and_split_suffix() {
        assert_eq!(
            model_id_from_path(Path::new("/nope/Foo.Q4_1.gguf")),
            "Foo.Q4_1"
        );
        assert_eq!(
            model_id_from_path(Path::new("/nope/big-00001-of-00003.gguf")),
            "big"
        );
    }
}
