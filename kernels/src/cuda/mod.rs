//! The CUDA backend: every op of [`Backend`] on one NVIDIA GPU through
//! cudarc, with kernels from `kernels/cuda/*.cu` compiled by NVRTC for the
//! device's architecture (cached on disk, see [`compile`]).
//!
//! Numerics follow the CPU reference ([`crate::cpu`]) op by op; the parity
//! tests in `kernels/tests/cuda_parity.rs` state each tolerance:
//!
//! - production matmuls quantize activations to the weight's
//!   `vec_dot_type` exactly like the CPU and sum integer block dots
//!   exactly, so only the float order of per-block sums differs;
//! - exact numerics dequantize weights in registers and use f32 dots;
//! - the paged KV pool holds f16 (production) or f32 (exact).
//!
//! Ops run in order on one stream. Ops whose trait signature cannot fail
//! (`rms_norm`, `rope`, ...) panic on a device error: after a failed
//! launch the context is unusable anyway.
//!
//! Module map: `compile.rs` (NVRTC + cache), and one wrapper per kernel
//! source, the only place launching its kernels: `elementwise.rs`,
//! `embed.rs`, `matmul.rs`, `attention.rs`, `hyper.rs`, and for compressed
//! attention `compressed.rs` (the pool, compressors), `indexer.rs` and
//! `compressed_attention.rs`.

// Kernel launches and raw device pointers: cudarc's launch API is unsafe
// (argument types are not checked against the kernel signatures), and
// weights imported from another process arrive as raw `CUdeviceptr`s.
#![allow(unsafe_code)]

/// Record a launch of kernel `$name` of backend `$be` with `grid` blocks
/// of `block` threads; each argument is a reference to a local of the
/// exact type of the kernel parameter (`u64` for pointers, `i32` for
/// `int`, `f32`, `u32`). The launch is issued later (see [`queue`]).
macro_rules! launch {
    // `($block, smem)`: with `smem` bytes of dynamic shared memory.
    ($be:expr, $name:expr, $grid:expr, ($block:expr, $smem:expr); $($arg:expr),* $(,)?) => {{
        let args = [$( $crate::cuda::queue::KernelArg::slot($arg) ),*];
        // The arguments match the kernel's parameter list in kernels/cuda
        // (each wrapper is the only launcher of its kernels), and every
        // pointer is a live device allocation sized for the launch (checked
        // by the wrapper before recording): `queue::issue` relies on it.
        $be.record_launch($name, $grid, $block, $smem, &args);
        Ok::<(), $crate::backend::BackendError>(())
    }};
    ($be:expr, $name:expr, $grid:expr, $block:expr; $($arg:expr),* $(,)?) => {
        launch!($be, $name, $grid, ($block, 0); $($arg),*)
    };
}

mod arena;
mod attention;
pub mod compile;
mod compressed;
mod compressed_attention;
mod decode_layer;
mod elementwise;
mod embed;
mod hyper;
mod indexer;
mod matmul;
mod moe;
mod options;
mod profile;
mod queue;

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr};

use crate::backend::{
    AttentionConfig, Backend, BackendError, Branch, CompressedAttentionConfig,
    CompressedPoolConfig, CompressedSeq, CompressorConfig, DenseLayer, DenseLayerConfig, HcConfig,
    KvDtype, KvPoolConfig, KvSeq, Numerics, RopeConfig, RouteConfig, TailRope, WeightSource,
};
use crate::quant::GgmlType;

pub use compile::CompileStats;
pub use compressed::CudaCompressedPool;
pub use options::{leak_path, CudaOptions};
pub use queue::{GraphStats, HostTiming};

/// Row-major `[rows, cols]` f32 activations in device memory: a piece of
/// the backend's tensor arena, which is reused once no tensor is alive
/// (tensors are meant to live for one forward pass).
pub struct CudaTensor {
    rows: usize,
    cols: usize,
    ptr: u64,
    _live: Live,
}

/// Counts a live tensor (the arena is reset when none is alive).
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl CudaTensor {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaTensor[{}, {}]", self.rows, self.cols)
    }
}

enum WeightMem {
    /// Uploaded by [`Backend::bind_weight`].
    Owned(queue::Deferred<CudaSlice<u8>>),
    /// Memory this backend does not own (a CUDA VMM mapping imported from
    /// the weight owner); `_owner` keeps the mapping alive.
    Device {
        ptr: u64,
        _owner: Arc<dyn Any + Send + Sync>,
    },
}

/// A weight in device memory, in its GGUF block layout.
pub struct CudaWeight {
    pub name: String,
    pub ggml_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    mem: WeightMem,
    /// One-row weights (norm scales) dequantized to f32, used element-wise.
    dense: Option<queue::Deferred<CudaSlice<f32>>>,
}

impl std::fmt::Debug for CudaWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaWeight({:?}, {}, [{}, {}])",
            self.name, self.ggml_type, self.rows, self.cols
        )
    }
}

/// The paged KV pool: `n_blocks` blocks of `block_bytes` each, allocated
/// (zeroed) up front, laid out exactly as [`Backend::kv_read_block`]
/// returns a block.
pub struct CudaKvPool {
    cfg: KvPoolConfig,
    dtype: KvDtype,
    buf: queue::Deferred<CudaSlice<u8>>,
}

impl CudaKvPool {
    pub fn config(&self) -> KvPoolConfig {
        self.cfg
    }
}

/// Weight types the CUDA kernels read, with their kernel-name suffix.
pub fn kernel_suffix(ty: GgmlType) -> Option<&'static str> {
    Some(match ty {
        GgmlType::F32 => "f32",
        GgmlType::F16 => "f16",
        GgmlType::Q4_0 => "q4_0",
        GgmlType::Q4_1 => "q4_1",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q5_K => "q5_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::Q2_K => "q2_k",
        GgmlType::IQ2_XXS => "iq2_xxs",
        // Index tables (hash routing): read by moe_route and embed only.
        GgmlType::I32 => "i32",
        _ => return None,
    })
}

const SUPPORTED: &str = "f32, f16, q4_0, q4_1, q5_0, q8_0, q2_K, q4_K, q5_K, q6_K, iq2_xxs, i32";

fn dev_err(what: &str, e: impl std::fmt::Debug) -> BackendError {
    let s = format!("{what}: {e:?}");
    if s.contains("OUT_OF_MEMORY") {
        BackendError::OutOfMemory(s)
    } else {
        BackendError::Device(s)
    }
}

/// Kernels that can quantize their output for the next matmul (see
/// [`CudaBackend::fuse_quantization`]).
#[derive(Clone, Copy, Debug)]
enum Producer {
    RmsNorm,
    AddRmsNorm,
    Swiglu,
    Attention,
}

impl Producer {
    /// Kernels of each kind.
    /// (The d16 attention kernels, for heads of 512, do not quantize.)
    const KERNELS: [(&'static str, Producer); 7] = [
        ("rms_norm", Producer::RmsNorm),
        ("add_rms_norm", Producer::AddRmsNorm),
        ("swiglu", Producer::Swiglu),
        ("attn_part_f16_d2", Producer::Attention),
        ("attn_part_f16_d4", Producer::Attention),
        ("attn_part_f32_d2", Producer::Attention),
        ("attn_part_f32_d4", Producer::Attention),
    ];

    /// Argument indices of the output and of the format code (the four
    /// quantization outputs follow it).
    fn args(self) -> (usize, usize) {
        match self {
            Producer::RmsNorm => (2, 5),
            Producer::AddRmsNorm => (3, 6),
            Producer::Swiglu => (2, 5),
            Producer::Attention => (15, 16),
        }
    }
}

/// The CUDA backend on one device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    numerics: Numerics,
    arch: u32,
    funcs: HashMap<&'static str, CudaFunction>,
    stats: CompileStats,
    /// Batched quantized matmuls on int8 tensor cores (sm_80+).
    tensor_cores: AtomicBool,
    /// Dynamic shared memory a block may opt into (bytes).
    smem_optin: u32,
    /// Streaming multiprocessors.
    sm_count: usize,
    /// Recorded commands, arenas, staging and graphs.
    state: Arc<Mutex<queue::State>>,
    /// Tensors alive.
    live: Arc<AtomicUsize>,
    /// Pending commands past which a norm op issues them first (0: never).
    chunk: usize,
    /// Function handles of the kernels that can quantize their output.
    producers: Vec<(usize, Producer)>,
    /// The `rope` kernel's handle (its launch may fuse with the KV store).
    rope_func: usize,
    /// [`CudaOptions::dp4a_tokens`].
    dp4a_tokens: usize,
    /// [`CudaOptions::mvt_tokens`].
    mvt_tokens: usize,
    /// [`CudaOptions::fused_layer`], where the device allows it.
    fused_layer: bool,
    /// [`CudaOptions::staged_q8`], where the device allows it (sm_80+:
    /// cp.async).
    staged_q8: bool,
    /// [`CudaOptions::warp_mv`].
    warp_mv: bool,
    /// [`CudaOptions::grouped_mv`].
    grouped_mv: bool,
    /// [`CudaOptions::hc_fuse`].
    hc_fuse: bool,
    /// [`CudaOptions::hc_branch`] (the side stream is in the state).
    hc_branch: bool,
    /// [`CudaOptions::branches`] (the side stream is in the state).
    branches: bool,
    /// [`CudaOptions::timing`].
    timing: bool,
    /// Whether the fused layer's cluster fits the device, by its shared
    /// memory size (asked once per size).
    cluster_fit: Mutex<HashMap<u32, bool>>,
    /// Tail-RoPE frequencies uploaded so far.
    tail_ropes: hyper::TailRopes,
}

/// Read-backs up to this many bytes land in pinned memory and are copied
/// out. SmolLM2's logits (196 KB) after each decode step: tg128 1319-1344
/// -> 1416-1429 tok/s on an H200. 64 streams' logits (12.6 MB) lost by
/// the extra host copy (6,006-6,102 -> 4,530-4,931 tok/s aggregate);
/// 16 streams' (3.1 MB) were the same either way.
const PINNED_READ_BACK: usize = 1 << 20;

impl CudaBackend {
    /// Opens device `ordinal` (its primary context, so memory other code
    /// maps in that context is usable here), and loads every kernel module,
    /// compiling with NVRTC for the device's compute capability unless the
    /// disk cache has it.
    /// The switches are the defaults with the `DS4_CUDA_*` environment
    /// variables applied ([`CudaOptions::from_env`]).
    pub fn new(ordinal: usize, numerics: Numerics) -> Result<CudaBackend, BackendError> {
        CudaBackend::with_options(ordinal, CudaOptions::from_env(numerics))
    }

    /// [`CudaBackend::new`] with explicit switches.
    pub fn with_options(ordinal: usize, opts: CudaOptions) -> Result<CudaBackend, BackendError> {
        let numerics = opts.numerics;
        // SAFETY: only tries to dlopen the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(BackendError::Device(
                "the NVIDIA driver library (libcuda.so.1) is not installed".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| dev_err("opening the CUDA device", e))?;
        // SAFETY: this backend issues all its work on one stream, so the
        // per-buffer events cudarc records for cross-stream ordering are
        // not needed.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| dev_err("querying the compute capability", e))?;
        let arch = (major * 10 + minor) as u32;
        // Its own stream: the legacy default stream cannot be captured.
        let stream = ctx
            .new_stream()
            .map_err(|e| dev_err("creating a CUDA stream", e))?;
        compile::nvrtc_available().map_err(BackendError::Device)?;
        let smem_optin = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(|e| dev_err("querying the shared memory size", e))? as u32;
        let sm_count =
            ctx.attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| dev_err("querying the multiprocessor count", e))? as usize;
        let mut stats = CompileStats::default();
        let mut funcs = HashMap::new();
        for src in compile::SOURCES {
            let ptx = compile::load_or_compile(src, arch, opts.kernel_dir, &mut stats)
                .map_err(BackendError::Device)?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| dev_err(&format!("loading module {}", src.name), e))?;
            for &k in src.kernels {
                let f = module
                    .load_function(k)
                    .map_err(|e| dev_err(&format!("kernel {k} of {}.cu", src.name), e))?;
                if src.big_smem {
                    // The opt-in limit covers static and dynamic shared
                    // memory together.
                    let fixed = f
                        .get_attribute(
                            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                        )
                        .map_err(|e| dev_err(&format!("querying {k}'s shared memory"), e))?;
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem_optin as i32 - fixed,
                    )
                    .map_err(|e| dev_err(&format!("allowing {k} its shared memory"), e))?;
                }
                funcs.insert(k, f);
            }
        }
        let mut state = queue::State::new(opts.graphs);
        state.pdl = arch >= 90 && opts.pdl;
        if opts.hc_branch || opts.branches {
            state.side = Some(queue::Side::new(&ctx)?);
        }
        if state.pdl && opts.zero_kernel {
            state.zero_func = funcs["zero_bytes"].cu_function() as usize;
        }
        for (&name, f) in &funcs {
            state
                .profile_names
                .names
                .insert(f.cu_function() as usize, name);
        }
        if opts.profile {
            state.profile = Some(state.profile_names.fresh());
        }
        let producers = Producer::KERNELS
            .iter()
            .map(|&(k, p)| (funcs[k].cu_function() as usize, p))
            .collect();
        let rope_func = funcs["rope"].cu_function() as usize;
        // The fused layer's cluster of 16 is past the portable 8.
        let fused_layer = arch >= 90
            && opts.fused_layer
            && funcs[decode_layer::KERNEL]
                .set_attribute(
                    cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED,
                    1,
                )
                .is_ok();
        Ok(CudaBackend {
            ctx,
            stream,
            numerics,
            arch,
            funcs,
            stats,
            tensor_cores: AtomicBool::new(arch >= 80),
            smem_optin,
            sm_count,
            state: Arc::new(Mutex::new(state)),
            live: Arc::new(AtomicUsize::new(0)),
            producers,
            rope_func,
            mvt_tokens: opts.mvt_tokens,
            dp4a_tokens: opts.dp4a_tokens,
            chunk: opts.chunk_cmds,
            timing: opts.timing,
            fused_layer,
            staged_q8: opts.staged_q8 && arch >= 80,
            warp_mv: opts.warp_mv,
            grouped_mv: opts.grouped_mv,
            hc_fuse: opts.hc_fuse,
            hc_branch: opts.hc_branch,
            branches: opts.branches,
            cluster_fit: Mutex::new(HashMap::new()),
            tail_ropes: hyper::TailRopes::default(),
        })
    }

    /// How many kernel modules were compiled and how many came from the
    /// disk cache when this backend was created.
    pub fn compile_stats(&self) -> CompileStats {
        self.stats
    }

    /// Whether batched quantized matmuls use int8 tensor cores (on by
    /// default from sm_80; off, they use the dp4a kernel that decode uses).
    /// Both give the same integers; tests switch to compare them.
    pub fn set_tensor_cores(&self, on: bool) {
        self.tensor_cores
            .store(on && self.arch >= 80, Ordering::Relaxed);
    }

    /// Fuses the quantization of activation `x` (format code `fmt`, into
    /// the buffers `q` = aq, ad, as, bs of matmul.cu) into the kernel that
    /// produced `x`, when that is the last command recorded but for
    /// memsets of tensors made since: an RMSNorm (plain or with the
    /// residual add), SwiGLU, or one-split decode attention launch
    /// (Q8_0 / Q8_1 only: a head holds whole blocks) writing exactly `x`,
    /// not fused yet.
    /// The producer is recorded again with its quantization outputs set
    /// (quant_warp256: the same bits as the separate kernel), then the
    /// memsets (fresh tensors: the producer touches none of them). Returns
    /// whether it did.
    fn fuse_quantization(&self, x: &CudaTensor, fmt: i32, q: [u64; 4]) -> bool {
        use queue::{Cmd, KernelArg};
        if fmt == 2 && !x.cols.is_multiple_of(256) {
            return false;
        }
        let mut st = self.lock();
        let Some((
            back,
            Cmd::Launch {
                func, grid, args, ..
            },
        )) = st.last_launch(|c| matches!(c, Cmd::Memset { .. }))
        else {
            return false;
        };
        let Some(&(_, kind)) = self.producers.iter().find(|p| p.0 == *func) else {
            return false;
        };
        let (out_i, fmt_i) = kind.args();
        let shape_ok = match kind {
            Producer::Swiglu => args[3] == (x.rows * x.cols) as u64 && args[4] == x.cols as u64,
            Producer::RmsNorm | Producer::AddRmsNorm => {
                grid.0 as usize == x.rows && args[fmt_i - 2] == x.cols as u64
            }
            // One split (the kernel writes the output itself), whole
            // 32-value blocks per head, not Q8_K's 256 values.
            Producer::Attention => {
                let hd = args[9];
                fmt != 2
                    && grid.2 == 1
                    && grid.0 as usize == x.rows
                    && grid.1 as u64 * hd == x.cols as u64
                    && hd.is_multiple_of(32)
            }
        };
        if args[out_i] != x.ptr || args[fmt_i] != (-1i32).slot() || !shape_ok {
            return false;
        }
        st.edit(back, |mut producer| {
            if let Cmd::Launch { args, .. } = &mut producer {
                args[fmt_i] = fmt.slot();
                args[fmt_i + 1..fmt_i + 5].copy_from_slice(&q);
            }
            Some(producer)
        });
        st.fused_quantizations += 1;
        true
    }

    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores.load(Ordering::Relaxed)
    }

    /// Quantized batches of at most this many tokens take the dp4a kernel
    /// even where tensor cores are on.
    pub fn dp4a_tokens(&self) -> usize {
        self.dp4a_tokens
    }

    /// Quantized batches of at most this many tokens through large Q4_K
    /// matrices take the multi-token matvec.
    pub fn mvt_tokens(&self) -> usize {
        self.mvt_tokens
    }

    /// The device's compute capability as `major * 10 + minor` (90: sm_90).
    /// Whether one-token Q8_0 matvecs take the staged kernels
    /// ([`CudaOptions::staged_q8`]).
    pub fn staged_q8(&self) -> bool {
        self.staged_q8
    }

    /// Whether expert and grouped matvecs take one warp per output row
    /// ([`CudaOptions::warp_mv`]).
    pub fn warp_mv(&self) -> bool {
        self.warp_mv
    }

    /// Whether one-token grouped Q8_0 projections take the dense matvec
    /// ([`CudaOptions::grouped_mv`]).
    pub fn grouped_mv(&self) -> bool {
        self.grouped_mv
    }

    /// Whether hyper-connection posts fuse with the ops around them
    /// ([`CudaOptions::hc_fuse`]).
    pub fn hc_fuse(&self) -> bool {
        self.hc_fuse
    }

    /// Whether the hyper-connection Sinkhorn runs on the side stream
    /// ([`CudaOptions::hc_branch`]).
    pub fn hc_branch(&self) -> bool {
        self.hc_branch
    }

    pub fn arch(&self) -> u32 {
        self.arch
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        let mut st = self.lock();
        self.sync_locked(&mut st)
    }

    /// Whether forward passes seen before are replayed as CUDA graphs (on
    /// by default). Off, every recorded list is issued directly; both
    /// give the same results, tests switch to compare them.
    pub fn set_graphs(&self, on: bool) {
        self.lock().graphs_on = on;
    }

    /// How recorded passes were issued so far.
    pub fn graph_stats(&self) -> GraphStats {
        self.lock().stats
    }

    /// The device's streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// How many KV stores ran inside the RoPE launch before them.
    pub fn fused_rope_stores(&self) -> u64 {
        self.lock().fused_rope_stores
    }

    /// How many zeroings of fresh tensors were dropped because the op
    /// after them writes the whole tensor.
    pub fn dropped_memsets(&self) -> u64 {
        self.lock().dropped_memsets
    }

    /// How many residual adds ran inside the hyper-connection post after
    /// them, and how many hc_pre norms came from the post before them.
    pub fn fused_hc(&self) -> (u64, u64) {
        let st = self.lock();
        (st.fused_hc_adds, st.fused_hc_norms)
    }

    /// How many side branches ([`Branch::Beside`]) were recorded for the
    /// side stream.
    pub fn side_branches(&self) -> u64 {
        self.lock().side_branches
    }

    /// Where the host's time went (recording, issuing, waiting).
    pub fn host_timing(&self) -> HostTiming {
        self.lock().timing
    }

    /// How many matmul activation quantizations ran inside the norm or
    /// SwiGLU kernel that produced the activation.
    pub fn fused_quantizations(&self) -> u64 {
        self.lock().fused_quantizations
    }

    /// The backend's state. Code under the lock that calls the driver
    /// directly binds the context first (ops run on any thread).
    fn lock(&self) -> MutexGuard<'_, queue::State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| dev_err("binding the CUDA context to this thread", e))
    }

    /// Issues everything recorded and waits for it.
    fn sync_locked(&self, st: &mut queue::State) -> Result<(), BackendError> {
        self.bind()?;
        st.flush(&self.stream)?;
        st.wait(&self.stream)
    }

    /// Issues the pending commands when there are more than a chunk's worth,
    /// so that the device runs them while the host records the rest of
    /// the pass (each chunk is a list of its own, replayed as its own
    /// graph). Called where an op starts a new stage of the pass (norms),
    /// so that the quantization fusion still finds its producer.
    fn issue_chunk(&self) -> Result<(), BackendError> {
        let mut st = self.lock();
        // Not inside a side branch (the list's end would join it).
        if self.chunk > 0 && st.pending() >= self.chunk && !st.in_side && !st.branch_open {
            st.flush(&self.stream)?;
        }
        Ok(())
    }

    fn record_launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[u64],
    ) {
        let f = self.func(name).cu_function();
        self.lock().launch(f, grid, block, smem, args);
    }

    /// Binds a weight that already lives in device memory (e.g. a CUDA VMM
    /// range imported from the weight owner and mapped in this device's
    /// primary context), without copying. `owner` is kept alive as long as
    /// the weight (drop the mapping there).
    ///
    /// # Safety
    ///
    /// `ptr .. ptr + len` must be readable device memory of this backend's
    /// device, holding the weight's GGUF bytes, mapped and unchanged for as
    /// long as the returned weight (and `owner`) live.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn bind_weight_device(
        &self,
        name: &str,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        ptr: u64,
        len: usize,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Result<CudaWeight, BackendError> {
        let row_bytes = check_weight(name, ggml_type, rows, cols, len)?;
        if !ptr.is_multiple_of(4) {
            return Err(BackendError::BadWeight {
                name: name.into(),
                problem: format!("device address {ptr:#x} is not 4-byte aligned"),
            });
        }
        self.finish_weight(
            name,
            ggml_type,
            rows,
            cols,
            row_bytes,
            WeightMem::Device { ptr, _owner: owner },
        )
    }

    fn finish_weight(
        &self,
        name: &str,
        ggml_type: GgmlType,
        rows: usize,
        cols: usize,
        row_bytes: usize,
        mem: WeightMem,
    ) -> Result<CudaWeight, BackendError> {
        let mut w = CudaWeight {
            name: name.into(),
            ggml_type,
            rows,
            cols,
            row_bytes,
            mem,
            dense: None,
        };
        if rows == 1 {
            let dense = self
                .stream
                .alloc_zeros::<f32>(cols)
                .map_err(|e| dev_err("allocating a dense weight", e))?;
            // F32 values are the dense copy already (any width: see
            // check_weight); other types are dequantized by the gather.
            if ggml_type == GgmlType::F32 {
                if cols > 0 {
                    self.lock().push(queue::Cmd::DtoD {
                        dst: self.ptr(&dense),
                        src: self.weight_ptr(&w),
                        bytes: 4 * cols,
                    });
                }
            } else {
                embed::embed_ptr(self, &w, &[0], self.ptr(&dense), cols)?;
            }
            self.lock().flush(&self.stream)?;
            w.dense = Some(queue::Deferred::new(dense, self.state.clone()));
        }
        Ok(w)
    }

    /// Index of the largest value of each row (the first on ties).
    pub fn argmax_rows(&self, x: &CudaTensor) -> Result<Vec<u32>, BackendError> {
        elementwise::argmax_rows(self, x)
    }

    /// A tensor from the arena; zeroed unless `data` fills it.
    fn arena_tensor(
        &self,
        rows: usize,
        cols: usize,
        data: Option<&[f32]>,
    ) -> Result<CudaTensor, BackendError> {
        let mut st = self.lock();
        if self.live.load(Ordering::Acquire) == 0 {
            st.reset_tensors(&self.stream)?;
        }
        let bytes = rows * cols * 4;
        let ptr = match data {
            Some(d) => st.upload(&self.stream, bytemuck_f32(d))?,
            None => {
                let ptr = st.tensors.alloc(&self.stream, bytes)?;
                if bytes > 0 {
                    st.push(queue::Cmd::Memset { dst: ptr, bytes });
                }
                ptr
            }
        };
        self.live.fetch_add(1, Ordering::AcqRel);
        Ok(CudaTensor {
            rows,
            cols,
            ptr,
            _live: Live(self.live.clone()),
        })
    }

    /// The op about to be recorded writes every value of `t`: its fresh
    /// zeroing, if still pending and untouched since, is dropped.
    fn overwrites(&self, t: &CudaTensor) {
        let bytes = t.rows * t.cols * 4;
        let mut st = self.lock();
        if bytes > 0 && st.drop_fresh_memset(t.ptr, bytes) {
            st.dropped_memsets += 1;
        }
    }

    /// `bytes` of uninitialized tensor-arena memory for the op being
    /// recorded (an op's inputs are alive, so the arena is not reset before
    /// its commands are issued).
    fn arena_bytes(&self, bytes: usize) -> Result<u64, BackendError> {
        let mut st = self.lock();
        st.tensors.alloc(&self.stream, bytes)
    }

    fn func(&self, name: &str) -> &CudaFunction {
        self.funcs
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in any loaded module"))
    }

    /// The device address of an owned buffer (kernels take raw pointers).
    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    /// The device address of a one-row weight's f32 values (norm scales,
    /// biases), which element-wise kernels read.
    fn dense_ptr(&self, w: &CudaWeight) -> u64 {
        let dense = w
            .dense
            .as_ref()
            .expect("element-wise weight is one row and bound dense");
        self.ptr(dense)
    }

    fn weight_ptr(&self, w: &CudaWeight) -> u64 {
        match &w.mem {
            WeightMem::Owned(s) => self.ptr(s),
            WeightMem::Device { ptr, .. } => *ptr,
        }
    }

    /// Uninitialized scratch for one op: one buffer of each size in bytes,
    /// valid until the next op asks for scratch (commands run in order).
    fn scratch(&self, sizes: &[usize]) -> Result<Vec<u64>, BackendError> {
        let mut st = self.lock();
        st.reset_scratch(&self.stream)?;
        sizes
            .iter()
            .map(|&n| st.scratch_region().alloc(&self.stream, n))
            .collect()
    }

    /// The device address of a copy of `words` (32-bit values: token ids,
    /// positions, attention tables), made once per pass for each content.
    fn upload_cached<T: Copy + Into<i64>>(&self, words: &[T]) -> Result<u64, BackendError> {
        let key: Vec<u8> = words
            .iter()
            .flat_map(|&w| (w.into() as u32).to_le_bytes())
            .collect();
        let mut st = self.lock();
        if let Some(&p) = st.uploads.get(&key) {
            return Ok(p);
        }
        let p = st.upload(&self.stream, &key)?;
        // A side branch's copy runs on the side stream: the main line
        // must not take it for its own (it could run first).
        if !st.in_side {
            st.uploads.insert(key, p);
        }
        Ok(p)
    }

    /// Copies `n` values at device address `src` to the host, after
    /// everything recorded before: up to [`PINNED_READ_BACK`] bytes
    /// through pinned memory, more straight into pageable memory.
    fn read_back<T: Copy + Default>(&self, src: u64, n: usize) -> Result<Vec<T>, BackendError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut st = self.lock();
        self.bind()?;
        st.flush(&self.stream)?;
        if n * std::mem::size_of::<T>() > PINNED_READ_BACK {
            let mut v = vec![T::default(); n];
            // A copy to pageable memory returns when it is done: it waits.
            let start = std::time::Instant::now();
            // SAFETY: `src` holds `n` values of T (checked by the caller)
            // and the copy is ordered after the commands that wrote them.
            unsafe {
                cudarc::driver::result::memcpy_dtoh_async(&mut v, src, self.stream.cu_stream())
            }
            .map_err(|e| dev_err("device to host copy", e))?;
            st.timing.waiting_s += start.elapsed().as_secs_f64();
            st.wait(&self.stream)?;
            return Ok(v);
        }
        let buf = st
            .readback
            .reserve(n * std::mem::size_of::<T>())?
            .cast::<T>();
        // SAFETY: `buf` is pinned memory of at least n values of T, used by
        // nothing else until this returns; `src` holds `n` values of T
        // (checked by the caller) and the copy is ordered after the
        // commands that wrote them.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(buf, n);
            cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream())
        }
        .map_err(|e| dev_err("device to host copy", e))?;
        st.wait(&self.stream)?;
        // SAFETY: the copy has completed (waited for); `buf` holds n values.
        Ok(unsafe { std::slice::from_raw_parts(buf, n) }.to_vec())
    }
}

/// The bytes of f32 values (little-endian, as the device reads them).
fn bytemuck_f32(d: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialized bytes; u8 has no alignment.
    unsafe { std::slice::from_raw_parts(d.as_ptr().cast::<u8>(), std::mem::size_of_val(d)) }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let st = self.lock();
        if let Some(p) = &st.profile {
            eprintln!("CUDA kernel time (DS4_CUDA_PROFILE):\n{}", p.report());
        }
        if self.timing {
            let g = st.stats;
            eprintln!(
                "CUDA host time (DS4_CUDA_TIMING): {}; lists issued directly {}, graphs captured {}, \
                 graph replays {}",
                st.timing, g.direct, g.captured, g.replayed
            );
        }
    }
}

/// Checks a weight's geometry; returns its row size in bytes.
fn check_weight(
    name: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    len: usize,
) -> Result<usize, BackendError> {
    let bad = |problem: String| BackendError::BadWeight {
        name: name.into(),
        problem,
    };
    if kernel_suffix(ty).is_none() {
        return Err(bad(format!(
            "type {ty} has no CUDA kernels (supported: {SUPPORTED})"
        )));
    }
    // One-row F32 weights (norm scales, gate scales and biases of any
    // length) are only read element-wise, as their dense copy; index
    // tables are read value by value (DeepSeek V4's are 6 wide).
    let element_wise = (rows == 1 && ty == GgmlType::F32) || ty == GgmlType::I32;
    if !cols.is_multiple_of(32) && !element_wise {
        return Err(bad(format!(
            "rows of {cols} values: the CUDA kernels need a multiple of 32"
        )));
    }
    let row_bytes = ty.row_bytes(cols).ok_or_else(|| {
        bad(format!(
            "row of {cols} values is not whole {} blocks",
            ty.name()
        ))
    })?;
    let want = row_bytes
        .checked_mul(rows)
        .ok_or_else(|| bad("size overflows".into()))?;
    if want != len {
        return Err(bad(format!(
            "expected {want} bytes for {rows}x{cols}, got {len}"
        )));
    }
    Ok(row_bytes)
}

impl Backend for CudaBackend {
    type CompressedPool = CudaCompressedPool;
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvPool = CudaKvPool;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn branch(&self, at: Branch) {
        if self.branches {
            self.lock().branch(at);
        }
    }

    fn device_resident(&self) -> bool {
        true
    }

    fn profile(&self, on: bool) -> Result<Option<String>, BackendError> {
        let mut st = self.lock();
        // What was recorded before the switch is issued on the old terms.
        self.sync_locked(&mut st)?;
        let report = st.profile.take().map(|p| p.report());
        if on {
            st.profile = Some(st.profile_names.fresh());
        }
        Ok(report)
    }

    fn device_free_memory(&self) -> Option<u64> {
        self.bind().ok()?;
        cudarc::driver::result::mem_get_info()
            .ok()
            .map(|(free, _total)| free as u64)
    }

    fn bind_weight(&self, src: WeightSource) -> Result<CudaWeight, BackendError> {
        let row_bytes = check_weight(
            &src.name,
            src.ggml_type,
            src.rows,
            src.cols,
            src.bytes.len(),
        )?;
        if let Some(dev) = &src.device {
            if dev.len() != src.bytes.len() {
                return Err(BackendError::BadWeight {
                    name: src.name.clone(),
                    problem: format!(
                        "{} device bytes for a {}-byte tensor",
                        dev.len(),
                        src.bytes.len()
                    ),
                });
            }
            // SAFETY: `DeviceBytes::new`'s contract: readable device memory
            // of this device's primary context holding the tensor's bytes,
            // mapped while its owner (kept by the weight) lives.
            return unsafe {
                self.bind_weight_device(
                    &src.name,
                    src.ggml_type,
                    src.rows,
                    src.cols,
                    dev.ptr(),
                    dev.len(),
                    dev.owner(),
                )
            };
        }
        let buf = self
            .stream
            .clone_htod(src.bytes.as_slice())
            .map_err(|e| dev_err("host to device copy", e))?;
        self.finish_weight(
            &src.name,
            src.ggml_type,
            src.rows,
            src.cols,
            row_bytes,
            WeightMem::Owned(queue::Deferred::new(buf, self.state.clone())),
        )
    }

    fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        self.arena_tensor(rows, cols, None)
            .expect("CUDA tensor allocation")
    }

    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> CudaTensor {
        assert_eq!(data.len(), rows * cols, "tensor_from: data length");
        self.arena_tensor(rows, cols, Some(data))
            .expect("CUDA tensor upload")
    }

    fn to_host(&self, x: &CudaTensor) -> Vec<f32> {
        self.read_back(x.ptr, x.rows * x.cols)
            .expect("CUDA device to host copy")
    }

    fn dims(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn copy_row(&self, src: &CudaTensor, row: usize, dst: &mut CudaTensor, dst_row: usize) {
        assert_eq!(src.cols, dst.cols, "copy_row: column count");
        assert!(row < src.rows && dst_row < dst.rows, "copy_row: row range");
        let bytes = src.cols * 4;
        self.lock().push(queue::Cmd::DtoD {
            dst: dst.ptr + (dst_row * bytes) as u64,
            src: src.ptr + (row * bytes) as u64,
            bytes,
        });
    }

    fn kv_pool(&self, cfg: KvPoolConfig) -> Result<CudaKvPool, BackendError> {
        let dtype = self.kv_pool_dtype();
        let bytes = cfg
            .block_bytes(dtype)
            .checked_mul(cfg.n_blocks)
            .ok_or_else(|| BackendError::OutOfMemory(format!("KV pool {cfg:?} overflows")))?;
        let buf = self
            .stream
            .alloc_zeros::<u8>(bytes.max(4))
            .map_err(|e| dev_err(&format!("allocating a KV pool of {bytes} bytes"), e))?;
        Ok(CudaKvPool {
            cfg,
            dtype,
            buf: queue::Deferred::new(buf, self.state.clone()),
        })
    }

    fn kv_dtype(&self, pool: &CudaKvPool) -> KvDtype {
        pool.dtype
    }

    fn kv_read_block(
        &self,
        pool: &CudaKvPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        let bb = attention::check_block(pool, block, out.len())?;
        let start = block as usize * bb;
        self.sync_locked(&mut self.lock())?;
        self.stream
            .memcpy_dtoh(&pool.buf.slice(start..start + bb), out)
            .map_err(|e| dev_err("kv_read_block", e))
    }

    fn kv_write_block(
        &self,
        pool: &mut CudaKvPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        let bb = attention::check_block(pool, block, data.len())?;
        let start = block as usize * bb;
        self.lock().flush(&self.stream)?;
        self.stream
            .memcpy_htod(data, &mut pool.buf.slice_mut(start..start + bb))
            .map_err(|e| dev_err("kv_write_block", e))
    }

    fn embed(
        &self,
        table: &CudaWeight,
        ids: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        embed::embed(self, table, ids, out)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32, out: &mut CudaTensor) {
        elementwise::rms_norm(self, x, w, eps, out).expect("CUDA rms_norm");
    }

    fn matmul(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        matmul::matmul(self, w, x, out)
    }

    fn matmul_many(
        &self,
        ws: &[&CudaWeight],
        biases: Option<&[&CudaWeight]>,
        x: &CudaTensor,
        outs: &mut [&mut CudaTensor],
    ) -> Result<(), BackendError> {
        matmul::matmul_many(self, ws, biases, x, outs)
    }

    fn add_rms_norm(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
        out: &mut CudaTensor,
    ) {
        elementwise::add_rms_norm(self, x, y, w, eps, out).expect("CUDA add_rms_norm");
    }

    fn rope(&self, x: &mut CudaTensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig) {
        elementwise::rope(self, x, positions, head_dim, cfg).expect("CUDA rope");
    }

    fn rope_qk(
        &self,
        q: &mut CudaTensor,
        k: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        cfg: &RopeConfig,
    ) {
        elementwise::rope_qk(self, q, k, positions, head_dim, cfg).expect("CUDA rope");
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        pool: &mut CudaKvPool,
        layer: usize,
        seqs: &[KvSeq<'_>],
        cfg: &AttentionConfig,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        attention::attention(self, q, k, v, pool, layer, seqs, cfg, out)
    }

    fn fuses_dense_layer(
        &self,
        layer: &DenseLayer<'_, CudaWeight>,
        cfg: &DenseLayerConfig,
        pool: &CudaKvPool,
        rows: usize,
    ) -> bool {
        decode_layer::supports(self, layer, cfg, pool, rows)
    }

    fn dense_layer(
        &self,
        layer: &DenseLayer<'_, CudaWeight>,
        cfg: &DenseLayerConfig,
        x: &mut CudaTensor,
        pool: &mut CudaKvPool,
        index: usize,
        seq: &KvSeq<'_>,
    ) -> Result<(), BackendError> {
        decode_layer::dense_layer(self, layer, cfg, x, pool, index, seq)
    }

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor, out: &mut CudaTensor) {
        elementwise::swiglu(self, gate, up, out).expect("CUDA swiglu");
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) {
        elementwise::add_assign(self, x, y).expect("CUDA add_assign");
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaWeight) {
        elementwise::add_bias(self, x, bias).expect("CUDA add_bias");
    }

    fn hc_pre(
        &self,
        x: &CudaTensor,
        mix: &CudaWeight,
        scale: &CudaWeight,
        base: &CudaWeight,
        cfg: &HcConfig,
        out: &mut CudaTensor,
        split: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        hyper::hc_pre(self, x, mix, scale, base, cfg, out, split)
    }

    fn hc_expand(&self, x: &CudaTensor, n_hc: usize, out: &mut CudaTensor) {
        hyper::hc_expand(self, x, n_hc, out).expect("CUDA hc_expand");
    }

    fn hc_post(&self, x: &mut CudaTensor, y: &CudaTensor, split: &CudaTensor, cfg: &HcConfig) {
        hyper::hc_post(self, x, y, split, cfg).expect("CUDA hc_post");
    }

    fn hc_head(
        &self,
        x: &CudaTensor,
        mix: &CudaWeight,
        scale: &CudaWeight,
        base: &CudaWeight,
        cfg: &HcConfig,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        hyper::hc_head(self, x, mix, scale, base, cfg, out)
    }

    fn rms_norm_heads(&self, x: &mut CudaTensor, head_dim: usize, eps: f32) {
        hyper::rms_norm_heads(self, x, head_dim, eps).expect("CUDA rms_norm_heads");
    }

    fn rope_tail(
        &self,
        x: &mut CudaTensor,
        positions: &[u32],
        head_dim: usize,
        rope: &TailRope,
        inverse: bool,
    ) {
        hyper::rope_tail(self, x, positions, head_dim, rope, inverse).expect("CUDA rope_tail");
    }

    fn round_fp8(&self, x: &mut CudaTensor, width: usize, n_round: usize) {
        hyper::round_fp8(self, x, width, n_round).expect("CUDA round_fp8");
    }

    fn round_indexer(&self, x: &mut CudaTensor, dim: usize) {
        hyper::round_indexer(self, x, dim).expect("CUDA round_indexer");
    }

    fn round_f16(&self, x: &mut CudaTensor) {
        hyper::round_f16(self, x).expect("CUDA round_f16");
    }

    fn scale(&self, x: &mut CudaTensor, s: f32) {
        hyper::scale(self, x, s).expect("CUDA scale");
    }

    fn compressed_pool(
        &self,
        cfg: &CompressedPoolConfig,
    ) -> Result<CudaCompressedPool, BackendError> {
        compressed::pool(self, cfg)
    }

    fn compressed_begin(
        &self,
        pool: &mut CudaCompressedPool,
        slot: u32,
        window: Option<u32>,
    ) -> Result<(), BackendError> {
        compressed::begin(self, pool, slot, window)
    }

    fn window_store(
        &self,
        pool: &mut CudaCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        kv: &CudaTensor,
    ) -> Result<(), BackendError> {
        compressed::window_store(self, pool, layer, seqs, kv)
    }

    fn compress(
        &self,
        pool: &mut CudaCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        k: &CudaTensor,
        s: &CudaTensor,
        ape: &CudaWeight,
        norm: &CudaWeight,
        cfg: &CompressorConfig,
    ) -> Result<(), BackendError> {
        compressed::compress(self, pool, layer, seqs, k, s, ape, norm, cfg)
    }

    fn indexer_select(
        &self,
        pool: &CudaCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        q: &CudaTensor,
        w: &CudaTensor,
        top_k: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        indexer::select(self, pool, layer, seqs, q, w, top_k, out)
    }

    fn compressed_attention(
        &self,
        q: &CudaTensor,
        pool: &CudaCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        selected: Option<&CudaTensor>,
        sinks: &CudaWeight,
        cfg: &CompressedAttentionConfig,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        compressed_attention::attention(self, q, pool, layer, seqs, selected, sinks, cfg, out)
    }

    fn compressed_read_block(
        &self,
        pool: &CudaCompressedPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        compressed::read_block(self, pool, block, out)
    }

    fn compressed_write_block(
        &self,
        pool: &mut CudaCompressedPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        compressed::write_block(self, pool, block, data)
    }

    fn window_read(
        &self,
        pool: &CudaCompressedPool,
        window: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        compressed::window_read(self, pool, window, out)
    }

    fn window_write(
        &self,
        pool: &mut CudaCompressedPool,
        window: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        compressed::window_write(self, pool, window, data)
    }

    fn matmul_grouped(
        &self,
        w: &CudaWeight,
        x: &CudaTensor,
        groups: usize,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        moe::matmul_grouped(self, w, x, groups, out)
    }

    fn moe_route(
        &self,
        logits: &CudaTensor,
        bias: Option<&CudaWeight>,
        hash: Option<(&CudaWeight, &[u32])>,
        cfg: &RouteConfig,
        ids: &mut CudaTensor,
        weights: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        moe::route(self, logits, bias, hash, cfg, ids, weights)
    }

    fn moe_experts(
        &self,
        gate: &CudaWeight,
        up: &CudaWeight,
        down: &CudaWeight,
        n_expert: usize,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        clamp: f32,
        out: &mut CudaTensor,
    ) -> Result<(), BackendError> {
        moe::experts(self, gate, up, down, n_expert, x, ids, weights, clamp, out)
    }

    fn swiglu_clamped(&self, gate: &CudaTensor, up: &CudaTensor, clamp: f32, out: &mut CudaTensor) {
        hyper::swiglu_clamped(self, gate, up, clamp, out).expect("CUDA swiglu_clamped");
    }
}
