//! Compute primitives of ds4.
//!
//! - [`quant`]: ggml quant block formats (dequantization, activation
//!   quantization, quantized dot products).
//! - [`backend`]: the op interface every family forward pass is written
//!   against, and [`cpu`]: its reference implementation.
//! - `cuda` (feature `cuda`): the CUDA backend.
//! - `vmm` (feature `vmm`, implied by `cuda`): CUDA VMM allocations shared
//!   between processes by file descriptor, the layer the weight owner and
//!   its workers both use.
//!
//! This crate knows nothing of models, tokenizers or HTTP.

pub mod backend;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod quant;
#[cfg(feature = "vmm")]
pub mod vmm;

pub use backend::{
    AttentionConfig, Backend, BackendError, Branch, CompressedAttentionConfig,
    CompressedPoolConfig, CompressedSeq, CompressorConfig, CompressorKind, DenseLayer,
    DenseLayerConfig, DeviceBytes, HcConfig, HostBytes, KvDtype, KvPoolConfig, KvSeq, Numerics,
    RopeConfig, RopeMode, RouteConfig, TailRope, WeightSource,
};
pub use cpu::CpuBackend;
