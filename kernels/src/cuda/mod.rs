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
//! `embed.rs`, `matmul.rs`, `attention.rs`.

// Kernel launches and raw device pointers: cudarc's launch API is unsafe
// (argument types are not checked against the kernel signatures), and
// weights imported from another process arrive as raw `CUdeviceptr`s.
#![allow(unsafe_code)]

/// Launch kernel `$name` of backend `$be` with `grid` blocks of `block`
/// threads; each argument is a reference to a local of the exact type of
/// the kernel parameter (`u64` for pointers, `i32` for `int`, `f32`,
/// `u64`).
macro_rules! launch {
    ($be:expr, $name:expr, $grid:expr, $block:expr; $($arg:expr),* $(,)?) => {{
        use cudarc::driver::PushKernelArg;
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: $grid,
            block_dim: ($block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = $be.stream.launch_builder($be.func($name));
        $( b.arg($arg); )*
        // SAFETY: the arguments match the kernel's parameter list in
        // kernels/cuda (each wrapper is the only launcher of its kernels),
        // and every pointer is a live device allocation sized for the
        // launch (checked by the wrapper before launching).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| $crate::cuda::dev_err(&format!("launching {}", $name), e))
    }};
}

mod attention;
pub mod compile;
mod elementwise;
mod embed;
mod matmul;

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr};

use crate::backend::{
    AttentionConfig, Backend, BackendError, KvDtype, KvPoolConfig, KvSeq, Numerics, RopeConfig,
    WeightSource,
};
use crate::quant::GgmlType;

pub use compile::CompileStats;

/// Row-major `[rows, cols]` f32 activations in device memory.
pub struct CudaTensor {
    rows: usize,
    cols: usize,
    buf: CudaSlice<f32>,
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
    Owned(CudaSlice<u8>),
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
    dense: Option<CudaSlice<f32>>,
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
    buf: CudaSlice<u8>,
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
        _ => return None,
    })
}

const SUPPORTED: &str = "f32, f16, q4_0, q4_1, q5_0, q8_0, q4_K, q5_K, q6_K";

fn dev_err(what: &str, e: impl std::fmt::Debug) -> BackendError {
    let s = format!("{what}: {e:?}");
    if s.contains("OUT_OF_MEMORY") {
        BackendError::OutOfMemory(s)
    } else {
        BackendError::Device(s)
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
    /// Small index arrays uploaded recently (positions, attention tables),
    /// by content: every layer of a forward pass uploads the same ones, and
    /// a copy from pageable host memory stalls the host.
    uploads: std::sync::Mutex<std::collections::VecDeque<(Vec<u8>, CudaSlice<u8>)>>,
}

/// Index arrays kept by [`CudaBackend::upload_cached`].
const UPLOAD_CACHE: usize = 8;

impl CudaBackend {
    /// Opens device `ordinal` (its primary context, so memory other code
    /// maps in that context is usable here), and loads every kernel module,
    /// compiling with NVRTC for the device's compute capability unless the
    /// disk cache has it.
    pub fn new(ordinal: usize, numerics: Numerics) -> Result<CudaBackend, BackendError> {
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
        let stream = ctx.default_stream();
        compile::nvrtc_available().map_err(BackendError::Device)?;
        let mut stats = CompileStats::default();
        let mut funcs = HashMap::new();
        for src in compile::SOURCES {
            let ptx =
                compile::load_or_compile(src, arch, &mut stats).map_err(BackendError::Device)?;
            let module = ctx
                .load_module(ptx)
                .map_err(|e| dev_err(&format!("loading module {}", src.name), e))?;
            for &k in src.kernels {
                let f = module
                    .load_function(k)
                    .map_err(|e| dev_err(&format!("kernel {k} of {}.cu", src.name), e))?;
                funcs.insert(k, f);
            }
        }
        Ok(CudaBackend {
            ctx,
            stream,
            numerics,
            arch,
            funcs,
            stats,
            tensor_cores: AtomicBool::new(arch >= 80),
            uploads: Default::default(),
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

    pub fn tensor_cores(&self) -> bool {
        self.tensor_cores.load(Ordering::Relaxed)
    }

    /// The device's compute capability as `major * 10 + minor` (90: sm_90).
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
        self.stream
            .synchronize()
            .map_err(|e| dev_err("synchronize", e))
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
            let mut t = self.try_tensor(1, cols)?;
            embed::embed(self, &w, &[0], &mut t)?;
            w.dense = Some(t.buf);
        }
        Ok(w)
    }

    /// Index of the largest value of each row (the first on ties).
    pub fn argmax_rows(&self, x: &CudaTensor) -> Result<Vec<u32>, BackendError> {
        elementwise::argmax_rows(self, x)
    }

    fn try_tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor, BackendError> {
        let buf = self
            .stream
            .alloc_zeros::<f32>((rows * cols).max(1))
            .map_err(|e| dev_err("allocating a tensor", e))?;
        Ok(CudaTensor { rows, cols, buf })
    }

    fn func(&self, name: &str) -> &CudaFunction {
        self.funcs
            .get(name)
            .unwrap_or_else(|| panic!("kernel {name} is not in any loaded module"))
    }

    /// The device address of a buffer (kernels take raw pointers).
    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(&self.stream).0
    }

    fn weight_ptr(&self, w: &CudaWeight) -> u64 {
        match &w.mem {
            WeightMem::Owned(s) => self.ptr(s),
            WeightMem::Device { ptr, .. } => *ptr,
        }
    }

    /// Uninitialized scratch of `n` elements (at least one), for buffers a
    /// kernel overwrites entirely.
    fn scratch<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>, BackendError> {
        // SAFETY: callers only read what a kernel wrote first.
        unsafe { self.stream.alloc::<T>(n.max(1)) }.map_err(|e| dev_err("allocating scratch", e))
    }

    /// The device address of a copy of `words` (32-bit values, e.g. token
    /// positions or attention tables), reusing a recent upload of the same
    /// content. The copy stays alive until evicted by later uploads;
    /// freeing is ordered on the stream, after the kernels that read it.
    fn upload_cached<T: Copy + Into<i64>>(&self, words: &[T]) -> Result<u64, BackendError> {
        let key: Vec<u8> = words
            .iter()
            .flat_map(|&w| (w.into() as u32).to_le_bytes())
            .collect();
        let mut cache = self.uploads.lock().expect("upload cache");
        if let Some((_, buf)) = cache.iter().find(|(k, _)| *k == key) {
            return Ok(self.ptr(buf));
        }
        let buf = self.upload(&key)?;
        let ptr = self.ptr(&buf);
        if cache.len() == UPLOAD_CACHE {
            cache.pop_front();
        }
        cache.push_back((key, buf));
        Ok(ptr)
    }

    fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, BackendError> {
        if data.is_empty() {
            return self.scratch(1);
        }
        self.stream
            .clone_htod(data)
            .map_err(|e| dev_err("host to device copy", e))
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
    if !cols.is_multiple_of(32) {
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
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type KvPool = CudaKvPool;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn device_resident(&self) -> bool {
        true
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
        let buf = self.upload(src.bytes.as_slice())?;
        self.finish_weight(
            &src.name,
            src.ggml_type,
            src.rows,
            src.cols,
            row_bytes,
            WeightMem::Owned(buf),
        )
    }

    fn tensor(&self, rows: usize, cols: usize) -> CudaTensor {
        self.try_tensor(rows, cols).expect("CUDA tensor allocation")
    }

    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> CudaTensor {
        assert_eq!(data.len(), rows * cols, "tensor_from: data length");
        let buf = self.upload(data).expect("CUDA host to device copy");
        CudaTensor { rows, cols, buf }
    }

    fn to_host(&self, x: &CudaTensor) -> Vec<f32> {
        let n = x.rows * x.cols;
        if n == 0 {
            return Vec::new();
        }
        let mut v = vec![0.0f32; n];
        self.stream
            .memcpy_dtoh(&x.buf.slice(..n), &mut v)
            .expect("CUDA device to host copy");
        v
    }

    fn dims(&self, x: &CudaTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn copy_row(&self, src: &CudaTensor, row: usize, dst: &mut CudaTensor, dst_row: usize) {
        assert_eq!(src.cols, dst.cols, "copy_row: column count");
        assert!(row < src.rows && dst_row < dst.rows, "copy_row: row range");
        let c = src.cols;
        let from = src.buf.slice(row * c..(row + 1) * c);
        let mut to = dst.buf.slice_mut(dst_row * c..(dst_row + 1) * c);
        self.stream
            .memcpy_dtod(&from, &mut to)
            .expect("CUDA device to device copy");
    }

    fn kv_pool(&self, cfg: KvPoolConfig) -> Result<CudaKvPool, BackendError> {
        let dtype = match self.numerics {
            Numerics::Production => KvDtype::F16,
            Numerics::Exact => KvDtype::F32,
        };
        let bytes = cfg
            .block_bytes(dtype)
            .checked_mul(cfg.n_blocks)
            .ok_or_else(|| BackendError::OutOfMemory(format!("KV pool {cfg:?} overflows")))?;
        let buf = self
            .stream
            .alloc_zeros::<u8>(bytes.max(4))
            .map_err(|e| dev_err(&format!("allocating a KV pool of {bytes} bytes"), e))?;
        Ok(CudaKvPool { cfg, dtype, buf })
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

    fn rope(&self, x: &mut CudaTensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig) {
        elementwise::rope(self, x, positions, head_dim, cfg).expect("CUDA rope");
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

    fn swiglu(&self, gate: &CudaTensor, up: &CudaTensor, out: &mut CudaTensor) {
        elementwise::swiglu(self, gate, up, out).expect("CUDA swiglu");
    }

    fn add_assign(&self, x: &mut CudaTensor, y: &CudaTensor) {
        elementwise::add_assign(self, x, y).expect("CUDA add_assign");
    }

    fn add_bias(&self, x: &mut CudaTensor, bias: &CudaWeight) {
        elementwise::add_bias(self, x, bias).expect("CUDA add_bias");
    }
}
