//! The CUDA backend's tuning and diagnostic switches, in one struct that
//! binaries fill from their flags ([`CudaOptions`]). Every switch keeps
//! its documented environment variable: [`CudaOptions::from_env`] applies
//! them over the defaults (the binaries' flags read the same variables),
//! so nothing deeper in the backend reads the environment. None of the
//! switches changes results, except a kernel folder with changed sources.

use std::path::Path;

use crate::backend::Numerics;

/// How a [`super::CudaBackend`] computes and what it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    pub numerics: Numerics,
    /// Replay forward passes seen before as CUDA graphs
    /// (`DS4_CUDA_GRAPHS=0`: kernel by kernel, to rule graphs out).
    pub graphs: bool,
    /// Programmatic dependent launches on sm_90+ (`DS4_CUDA_PDL=0`: each
    /// kernel after the previous one finished).
    pub pdl: bool,
    /// With `pdl`, fresh tensors are zeroed by a kernel that launches
    /// early like the others rather than by memsets, which stop the
    /// early launch of the kernel after them (on by default;
    /// `DS4_CUDA_ZERO_KERNEL=0`: memsets).
    pub zero_kernel: bool,
    /// Single-token passes may run whole dense decoder layers in one
    /// cluster launch on sm_90+ (`DS4_CUDA_FUSED_LAYER=0`: op by op).
    pub fused_layer: bool,
    /// One-token Q8_0 matvecs copy their weight rows into shared memory
    /// with 16-byte loads and add a row's blocks in order, as the batched
    /// kernels do (`DS4_CUDA_STAGED_Q8=1`; off: one block a thread,
    /// 2-byte loads).
    pub staged_q8: bool,
    /// Expert and grouped matvecs of a few entries take one warp per
    /// output row, every lane's loads in flight at once
    /// (`DS4_CUDA_WARP_MV=0`: the block-per-rows kernels, which stage
    /// block terms in shared memory). Same bits either way.
    pub warp_mv: bool,
    /// One-token grouped Q8_0 projections (DeepSeek V4's output
    /// low-rank) run the dense decode matvec, each row reading its
    /// group's input (`DS4_CUDA_GROUPED_MV=0`: the expert matvecs, whose
    /// sums are in a batch's order).
    pub grouped_mv: bool,
    /// The hyper-connection post takes in the residual add before it and
    /// leaves the next pre step its sums of squares (no hc_norm launch)
    /// (`DS4_CUDA_HC_FUSE=0`: each op its own launch).
    pub hc_fuse: bool,
    /// The hyper-connection pre's Sinkhorn split runs on a second stream
    /// (a second graph branch) beside the sublayer, which needs it only
    /// at its post (`DS4_CUDA_HC_BRANCH=0`: in the collapse's kernel).
    pub hc_branch: bool,
    /// The side branches a forward pass marks ([`crate::Branch`]: DeepSeek
    /// V4's shared expert beside the routed ones, the KV row and the
    /// compressors beside the query path) run on the second stream
    /// (`DS4_CUDA_BRANCHES=0`: in line, in recording order).
    pub branches: bool,
    /// Quantized batches of at most this many tokens run the dp4a kernel
    /// rather than the tensor cores (`DS4_CUDA_DP4A_TOKENS`).
    pub dp4a_tokens: usize,
    /// Batches of at most this many tokens through large Q4_K matrices run
    /// the multi-token matvec; 0: never (`DS4_CUDA_MVT_TOKENS`).
    pub mvt_tokens: usize,
    /// Issue a pass in chunks of about this many commands, each its own
    /// graph, so the device runs one while the host records the next; 0:
    /// the whole pass at once (`DS4_CUDA_CHUNK`).
    pub chunk_cmds: usize,
    /// Time every kernel and print the table when the backend is dropped
    /// (`DS4_CUDA_PROFILE=1`; slow).
    pub profile: bool,
    /// Print where the host's time went when the backend is dropped
    /// (`DS4_CUDA_TIMING=1`).
    pub timing: bool,
    /// Read the kernel sources from this folder where it has them
    /// (`common.cuh`, `<name>.cu`, ...), else the built-in ones: for
    /// working on a kernel without rebuilding (`DS4_CUDA_KERNEL_DIR`).
    /// The folder's name lives for the process.
    pub kernel_dir: Option<&'static Path>,
}

impl CudaOptions {
    /// The defaults, in production numerics.
    pub const DEFAULT: CudaOptions = CudaOptions {
        numerics: Numerics::Production,
        graphs: true,
        pdl: true,
        // DeepSeek V4 Flash decode 56.7 -> 61.1 tok/s on an H200 (bench/NOTES.md).
        zero_kernel: true,
        fused_layer: true,
        // Off until measured on a GPU (bench/NOTES.md).
        staged_q8: false,
        // 94.6 -> 69.9 us for one token's 6 experts (bench/NOTES.md).
        warp_mv: true,
        grouped_mv: true,
        hc_fuse: true,
        hc_branch: true,
        // DeepSeek V4 Flash (28 blocks) tg128 103.4 -> 106.2 tok/s on an H100 (bench/NOTES.md).
        branches: true,
        dp4a_tokens: DP4A_TOKENS,
        mvt_tokens: MVT_TOKENS,
        chunk_cmds: CHUNK_CMDS,
        profile: false,
        timing: false,
        kernel_dir: None,
    };

    /// The defaults in `numerics`, with the `DS4_CUDA_*` environment
    /// variables applied (for programs without flags: tests, benches).
    pub fn from_env(numerics: Numerics) -> CudaOptions {
        let d = CudaOptions::DEFAULT;
        CudaOptions {
            numerics,
            graphs: env_bool("DS4_CUDA_GRAPHS", d.graphs),
            pdl: env_bool("DS4_CUDA_PDL", d.pdl),
            zero_kernel: env_bool("DS4_CUDA_ZERO_KERNEL", d.zero_kernel),
            fused_layer: env_bool("DS4_CUDA_FUSED_LAYER", d.fused_layer),
            staged_q8: env_bool("DS4_CUDA_STAGED_Q8", d.staged_q8),
            warp_mv: env_bool("DS4_CUDA_WARP_MV", d.warp_mv),
            grouped_mv: env_bool("DS4_CUDA_GROUPED_MV", d.grouped_mv),
            hc_fuse: env_bool("DS4_CUDA_HC_FUSE", d.hc_fuse),
            hc_branch: env_bool("DS4_CUDA_HC_BRANCH", d.hc_branch),
            branches: env_bool("DS4_CUDA_BRANCHES", d.branches),
            dp4a_tokens: env_usize("DS4_CUDA_DP4A_TOKENS", d.dp4a_tokens),
            mvt_tokens: env_usize("DS4_CUDA_MVT_TOKENS", d.mvt_tokens),
            chunk_cmds: env_usize("DS4_CUDA_CHUNK", d.chunk_cmds),
            profile: env_bool("DS4_CUDA_PROFILE", d.profile),
            timing: env_bool("DS4_CUDA_TIMING", d.timing),
            kernel_dir: std::env::var_os("DS4_CUDA_KERNEL_DIR")
                .filter(|v| !v.is_empty())
                .map(|v| leak_path(v.into())),
        }
    }
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions::DEFAULT
    }
}

/// Default of [`CudaOptions::mvt_tokens`].
pub const MVT_TOKENS: usize = 16;

/// Default of [`CudaOptions::dp4a_tokens`]. On an H200, 14336 x 4096
/// (`perf_small_batches`), the dp4a kernel against the tensor-core path
/// (tiled, split along K), in us: 2 tokens Q4_1 20 / 70, Q6_K 39 / 93;
/// 8 tokens 46 / 71, 65 / 93; 16 tokens 85 / 69, 116 / 89. (Large Q4_K
/// matrices take the multi-token matvec up to [`MVT_TOKENS`] first.)
pub const DP4A_TOKENS: usize = 8;

/// Default of [`CudaOptions::chunk_cmds`]: a decode step of SmolLM2 or a
/// 7B records 250-350 commands, so about six lists, each issued (as its
/// own graph) while the host records the next. 48 against 96: SmolLM2's
/// decode 1.5% faster, the 7B's the same.
pub const CHUNK_CMDS: usize = 48;

/// A folder name kept for the rest of the process (options are `Copy`).
pub fn leak_path(p: std::path::PathBuf) -> &'static Path {
    Box::leak(p.into_boxed_path())
}

/// A switch from the environment: `0`, `false`, `off` or `no` is off,
/// any other value on; unset: `default`.
fn env_bool(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => !matches!(v.trim(), "0" | "false" | "off" | "no"),
        Err(_) => default,
    }
}

/// The count in environment variable `name`, else `default` (unset or
/// not a number).
fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
