//! Launch wrappers of `moe.cu`: routing (sqrt-softplus, hash-routed or
//! biased top-k), the routed experts as grouped matvecs (decode) and
//! grouped GEMMs over the tokens gathered per expert (prefill), with the
//! clamped SwiGLU between them, and grouped projections.
//!
//! Not implemented yet: every op says so.

use super::{CudaBackend, CudaTensor, CudaWeight};
use crate::backend::{BackendError, RouteConfig};

fn missing(op: &str) -> BackendError {
    BackendError::Device(format!("{op} is not implemented on the CUDA backend yet"))
}

pub(super) fn matmul_grouped(
    _be: &CudaBackend,
    _w: &CudaWeight,
    _x: &CudaTensor,
    _groups: usize,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("matmul_grouped"))
}

pub(super) fn route(
    _be: &CudaBackend,
    _logits: &CudaTensor,
    _bias: Option<&CudaWeight>,
    _hash: Option<(&CudaWeight, &[u32])>,
    _cfg: &RouteConfig,
    _ids: &mut CudaTensor,
    _weights: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("moe_route"))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn experts(
    _be: &CudaBackend,
    _gate: &CudaWeight,
    _up: &CudaWeight,
    _down: &CudaWeight,
    _n_expert: usize,
    _x: &CudaTensor,
    _ids: &CudaTensor,
    _weights: &CudaTensor,
    _clamp: f32,
    _out: &mut CudaTensor,
) -> Result<(), BackendError> {
    Err(missing("moe_experts"))
}
