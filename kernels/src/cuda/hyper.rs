//! Launch wrappers of `hyper.cu`: hyper-connection mix/split/collapse and
//! post, the output head's collapse, RMSNorm of heads, tail RoPE, the
//! reference engine's activation roundings (FP8 K/V, Hadamard + FP4
//! indexer, f16), row scaling and the clamped SwiGLU.
//!
//! Not implemented yet: every op says so.

use super::{CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, HcConfig, TailRope};

fn missing(op: &str) -> BackendError {
    BackendError::Device(format!("{op} is not implemented on the CUDA backend yet"))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn hc_pre(
    _be: &CudaBackend,
    _x: &CudaTensor,
    _mix: &CudaWeight,
    _scale: &CudaWeight,
    _base: &CudaWeight,
    _cfg: &HcConfig,
    _out: &mut CudaTensor,
    _split: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("hc_pre"))
}

pub(super) fn hc_expand(
    _be: &CudaBackend,
    _x: &CudaTensor,
    _n_hc: usize,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("hc_expand"))
}

pub(super) fn hc_post(
    _be: &CudaBackend,
    _x: &mut CudaTensor,
    _y: &CudaTensor,
    _split: &CudaTensor,
    _cfg: &HcConfig,
) -> Result<(), BackendError> {
    Err(missing("hc_post"))
}

pub(super) fn hc_head(
    _be: &CudaBackend,
    _x: &CudaTensor,
    _mix: &CudaWeight,
    _scale: &CudaWeight,
    _base: &CudaWeight,
    _cfg: &HcConfig,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("hc_head"))
}

pub(super) fn rms_norm_heads(
    _be: &CudaBackend,
    _x: &mut CudaTensor,
    _head_dim: usize,
    _eps: f32,
) -> Result<(), BackendError> {
    Err(missing("rms_norm_heads"))
}

pub(super) fn rope_tail(
    _be: &CudaBackend,
    _x: &mut CudaTensor,
    _positions: &[u32],
    _head_dim: usize,
    _rope: &TailRope,
    _inverse: bool,
) -> Result<(), BackendError> {
    Err(missing("rope_tail"))
}

pub(super) fn round_fp8(
    _be: &CudaBackend,
    _x: &mut CudaTensor,
    _width: usize,
    _n_round: usize,
) -> Result<(), BackendError> {
    Err(missing("round_fp8"))
}

pub(super) fn round_indexer(
    _be: &CudaBackend,
    _x: &mut CudaTensor,
    _dim: usize,
) -> Result<(), BackendError> {
    Err(missing("round_indexer"))
}

pub(super) fn round_f16(_be: &CudaBackend, _x: &mut CudaTensor) -> Result<(), BackendError> {
    Err(missing("round_f16"))
}

pub(super) fn scale(_be: &CudaBackend, _x: &mut CudaTensor, _s: f32) -> Result<(), BackendError> {
    Err(missing("scale"))
}

pub(super) fn swiglu_clamped(
    _be: &CudaBackend,
    _gate: &CudaTensor,
    _up: &CudaTensor,
    _clamp: f32,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("swiglu_clamped"))
}
