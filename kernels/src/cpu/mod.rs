//! The CPU reference backend: every op of [`crate::backend::Backend`] in
//! plain Rust, multi-threaded with rayon over the machine's cores.
//!
//! Correctness and clarity first: this backend is the oracle the CUDA
//! backend is tested against. Quantized matmuls follow ggml's CPU path
//! (activations quantized to the weight type's `vec_dot_type`, integer dot
//! products per block) so that logits match llama.cpp closely.

mod attention;
mod compressed;
mod elementwise;
mod expf;
mod hyper;
mod matmul;
mod moe;
mod pool;
mod rope;
pub mod sampling;
#[cfg(target_arch = "x86_64")]
mod simd;

use crate::backend::{
    AttentionConfig, Backend, BackendError, CompressedAttentionConfig, CompressedPoolConfig,
    CompressedSeq, CompressorConfig, HcConfig, HostBytes, KvDtype, KvPoolConfig, KvSeq, Numerics,
    RopeConfig, RouteConfig, TailRope, WeightSource,
};
use crate::quant::{self, GgmlType};

pub use attention::CpuKvPool;
pub use compressed::CpuCompressedPool;

/// Row-major `[rows, cols]` activations in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl CpuTensor {
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A weight bound in place: quantized rows straight from the mapped file.
#[derive(Clone, Debug)]
pub struct CpuWeight {
    pub name: String,
    pub ggml_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    bytes: HostBytes,
    /// Dequantized copy of one-row weights (norm scales), used element-wise.
    dense: Option<Vec<f32>>,
}

impl CpuWeight {
    /// The quantized bytes of row `r`.
    pub fn row(&self, r: usize) -> &[u8] {
        &self.bytes.as_slice()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    fn dense(&self) -> &[f32] {
        self.dense
            .as_deref()
            .expect("element-wise weight is one row and bound dense")
    }

    /// All of the weight's bytes.
    fn bytes_all(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// Rows `first .. first + n` as a weight of their own (no copy).
    fn rows_view(&self, first: usize, n: usize) -> CpuWeight {
        CpuWeight {
            name: format!("{}[rows {first}..{}]", self.name, first + n),
            ggml_type: self.ggml_type,
            rows: n,
            cols: self.cols,
            row_bytes: self.row_bytes,
            bytes: self
                .bytes
                .slice(first * self.row_bytes, n * self.row_bytes)
                .expect("a row block inside the weight"),
            dense: None,
        }
    }

    /// A one-row weight's values; a clear error for anything else.
    fn dense_checked(&self, op: &'static str) -> Result<&[f32], BackendError> {
        self.dense.as_deref().ok_or_else(|| BackendError::Shape {
            op,
            detail: format!(
                "{} is [{}, {}], expected one row",
                self.name, self.rows, self.cols
            ),
        })
    }
}

/// The CPU backend. Threads come from rayon's global pool (one per core by
/// default; `RAYON_NUM_THREADS` overrides).
#[derive(Clone, Debug, Default)]
pub struct CpuBackend {
    numerics: Numerics,
}

impl CpuBackend {
    /// The serving configuration ([`Numerics::Production`]).
    pub fn new() -> CpuBackend {
        CpuBackend::default()
    }

    pub fn with_numerics(numerics: Numerics) -> CpuBackend {
        CpuBackend { numerics }
    }

    pub fn numerics(&self) -> Numerics {
        self.numerics
    }

    /// Threads the backend computes with.
    pub fn threads(&self) -> usize {
        rayon::current_num_threads()
    }
}

impl CpuBackend {
    /// The matmul of this backend's numerics, for ops built on it.
    fn matmul_fn(
        &self,
    ) -> impl Fn(&CpuWeight, &CpuTensor, &mut CpuTensor) -> Result<(), BackendError> + '_ {
        move |w, x, out| self.matmul(w, x, out)
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type KvPool = CpuKvPool;
    type CompressedPool = CpuCompressedPool;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn numerics(&self) -> Numerics {
        self.numerics
    }

    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        pool::run_awake(f)
    }

    fn bind_weight(&self, src: WeightSource) -> Result<CpuWeight, BackendError> {
        let bad = |problem: String| BackendError::BadWeight {
            name: src.name.clone(),
            problem,
        };
        let row_bytes = src.ggml_type.row_bytes(src.cols).ok_or_else(|| {
            bad(format!(
                "row of {} values is not whole {} blocks",
                src.cols,
                src.ggml_type.name()
            ))
        })?;
        let want = row_bytes
            .checked_mul(src.rows)
            .ok_or_else(|| bad("size overflows".into()))?;
        if want != src.bytes.len() {
            return Err(bad(format!(
                "expected {want} bytes for {}x{}, got {}",
                src.rows,
                src.cols,
                src.bytes.len()
            )));
        }
        let dense = if src.rows == 1 {
            let mut v = vec![0.0; src.cols];
            quant::dequantize_row(src.ggml_type, src.bytes.as_slice(), &mut v)
                .map_err(|e| bad(e.to_string()))?;
            Some(v)
        } else {
            None
        };
        Ok(CpuWeight {
            name: src.name,
            ggml_type: src.ggml_type,
            rows: src.rows,
            cols: src.cols,
            row_bytes,
            bytes: src.bytes,
            dense,
        })
    }

    fn tensor(&self, rows: usize, cols: usize) -> CpuTensor {
        CpuTensor {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> CpuTensor {
        assert_eq!(data.len(), rows * cols, "tensor_from: data length");
        CpuTensor {
            rows,
            cols,
            data: data.to_vec(),
        }
    }

    fn to_host(&self, x: &CpuTensor) -> Vec<f32> {
        x.data.clone()
    }

    fn dims(&self, x: &CpuTensor) -> (usize, usize) {
        (x.rows, x.cols)
    }

    fn copy_row(&self, src: &CpuTensor, row: usize, dst: &mut CpuTensor, dst_row: usize) {
        assert_eq!(src.cols, dst.cols, "copy_row: column count");
        let c = src.cols;
        dst.data[dst_row * c..(dst_row + 1) * c].copy_from_slice(src.row(row));
    }

    fn kv_pool(&self, cfg: KvPoolConfig) -> Result<CpuKvPool, BackendError> {
        Ok(CpuKvPool::new(cfg, self.kv_pool_dtype()))
    }

    fn kv_dtype(&self, pool: &CpuKvPool) -> KvDtype {
        pool.dtype()
    }

    fn kv_read_block(
        &self,
        pool: &CpuKvPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        pool.read_block(block, out)
    }

    fn kv_write_block(
        &self,
        pool: &mut CpuKvPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        pool.write_block(block, data)
    }

    fn embed(
        &self,
        table: &CpuWeight,
        ids: &[u32],
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        elementwise::embed(table, ids, out)
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32, out: &mut CpuTensor) {
        elementwise::rms_norm(x, w.dense(), eps, out);
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        x: &CpuTensor,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        match self.numerics {
            Numerics::Production => matmul::matmul(w, x, out),
            Numerics::Exact => matmul::matmul_exact(w, x, out),
        }
    }

    fn matmul_many(
        &self,
        ws: &[&CpuWeight],
        biases: Option<&[&CpuWeight]>,
        x: &CpuTensor,
        outs: &mut [&mut CpuTensor],
    ) -> Result<(), BackendError> {
        assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
        assert!(
            biases.is_none_or(|b| b.len() == ws.len()),
            "matmul_many: one bias per weight"
        );
        match self.numerics {
            // One quantization of `x` and one parallel region for all.
            Numerics::Production => matmul::matmul_many(ws, x, outs)?,
            Numerics::Exact => {
                for (w, out) in ws.iter().zip(outs.iter_mut()) {
                    matmul::matmul_exact(w, x, out)?;
                }
            }
        }
        if let Some(b) = biases {
            for (out, b) in outs.iter_mut().zip(b) {
                self.add_bias(out, b);
            }
        }
        Ok(())
    }

    fn rope(&self, x: &mut CpuTensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig) {
        rope::rope(x, positions, head_dim, cfg);
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        pool: &mut CpuKvPool,
        layer: usize,
        seqs: &[KvSeq<'_>],
        cfg: &AttentionConfig,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        attention::attention(q, k, v, pool, layer, seqs, cfg, out)
    }

    fn swiglu(&self, gate: &CpuTensor, up: &CpuTensor, out: &mut CpuTensor) {
        elementwise::swiglu(gate, up, out);
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) {
        elementwise::add_assign(x, y);
    }

    fn add_bias(&self, x: &mut CpuTensor, bias: &CpuWeight) {
        elementwise::add_bias(x, bias.dense());
    }

    fn hc_pre(
        &self,
        x: &CpuTensor,
        mix: &CpuWeight,
        scale: &CpuWeight,
        base: &CpuWeight,
        cfg: &HcConfig,
        out: &mut CpuTensor,
        split: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let (scale, base) = (
            scale.dense_checked("hc_pre")?,
            base.dense_checked("hc_pre")?,
        );
        hyper::hc_pre(x, mix, scale, base, cfg, out, split, &self.matmul_fn())
    }

    fn hc_expand(&self, x: &CpuTensor, n_hc: usize, out: &mut CpuTensor) {
        hyper::hc_expand(x, n_hc, out);
    }

    fn hc_post(&self, x: &mut CpuTensor, y: &CpuTensor, split: &CpuTensor, cfg: &HcConfig) {
        hyper::hc_post(x, y, split, cfg);
    }

    fn hc_head(
        &self,
        x: &CpuTensor,
        mix: &CpuWeight,
        scale: &CpuWeight,
        base: &CpuWeight,
        cfg: &HcConfig,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let (scale, base) = (
            scale.dense_checked("hc_head")?,
            base.dense_checked("hc_head")?,
        );
        hyper::hc_head(x, mix, scale, base, cfg, out, &self.matmul_fn())
    }

    fn rms_norm_heads(&self, x: &mut CpuTensor, head_dim: usize, eps: f32) {
        hyper::rms_norm_heads(x, head_dim, eps);
    }

    fn rope_tail(
        &self,
        x: &mut CpuTensor,
        positions: &[u32],
        head_dim: usize,
        rope: &TailRope,
        inverse: bool,
    ) {
        hyper::rope_tail(x, positions, head_dim, rope, inverse);
    }

    fn round_fp8(&self, x: &mut CpuTensor, width: usize, n_round: usize) {
        hyper::round_fp8(x, width, n_round);
    }

    fn round_indexer(&self, x: &mut CpuTensor, dim: usize) {
        hyper::round_indexer(x, dim);
    }

    fn round_f16(&self, x: &mut CpuTensor) {
        hyper::round_f16(x);
    }

    fn scale(&self, x: &mut CpuTensor, s: f32) {
        hyper::scale(x, s);
    }

    fn compressed_pool(
        &self,
        cfg: &CompressedPoolConfig,
    ) -> Result<CpuCompressedPool, BackendError> {
        CpuCompressedPool::new(cfg.clone())
    }

    fn compressed_begin(
        &self,
        pool: &mut CpuCompressedPool,
        slot: u32,
        window: Option<u32>,
    ) -> Result<(), BackendError> {
        compressed::begin(pool, slot, window)
    }

    fn window_store(
        &self,
        pool: &mut CpuCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        kv: &CpuTensor,
    ) -> Result<(), BackendError> {
        compressed::window_store(pool, layer, seqs, kv)
    }

    fn compress(
        &self,
        pool: &mut CpuCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        k: &CpuTensor,
        s: &CpuTensor,
        ape: &CpuWeight,
        norm: &CpuWeight,
        cfg: &CompressorConfig,
    ) -> Result<(), BackendError> {
        let norm = norm.dense_checked("compress")?;
        compressed::compress(pool, layer, seqs, k, s, ape, norm, cfg)
    }

    fn indexer_select(
        &self,
        pool: &CpuCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        q: &CpuTensor,
        w: &CpuTensor,
        top_k: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        compressed::indexer_select(pool, layer, seqs, q, w, top_k, out)
    }

    fn compressed_attention(
        &self,
        q: &CpuTensor,
        pool: &CpuCompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        selected: Option<&CpuTensor>,
        sinks: &CpuWeight,
        cfg: &CompressedAttentionConfig,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        let sinks = sinks.dense_checked("compressed_attention")?;
        compressed::compressed_attention(q, pool, layer, seqs, selected, sinks, cfg, out)
    }

    fn compressed_read_block(
        &self,
        pool: &CpuCompressedPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        compressed::read_block(pool, block, out)
    }

    fn compressed_write_block(
        &self,
        pool: &mut CpuCompressedPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        compressed::write_block(pool, block, data)
    }

    fn window_read(
        &self,
        pool: &CpuCompressedPool,
        window: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        compressed::window_read(pool, window, out)
    }

    fn window_write(
        &self,
        pool: &mut CpuCompressedPool,
        window: u32,
        data: &[u8],
    ) -> Result<(), BackendError> {
        compressed::window_write(pool, window, data)
    }

    fn matmul_grouped(
        &self,
        w: &CpuWeight,
        x: &CpuTensor,
        groups: usize,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        moe::matmul_grouped(w, x, groups, out, &self.matmul_fn())
    }

    fn moe_route(
        &self,
        logits: &CpuTensor,
        bias: Option<&CpuWeight>,
        hash: Option<(&CpuWeight, &[u32])>,
        cfg: &RouteConfig,
        ids: &mut CpuTensor,
        weights: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        moe::moe_route(logits, bias, hash, cfg, ids, weights)
    }

    fn moe_experts(
        &self,
        gate: &CpuWeight,
        up: &CpuWeight,
        down: &CpuWeight,
        n_expert: usize,
        x: &CpuTensor,
        ids: &CpuTensor,
        weights: &CpuTensor,
        clamp: f32,
        out: &mut CpuTensor,
    ) -> Result<(), BackendError> {
        moe::moe_experts(
            gate,
            up,
            down,
            n_expert,
            x,
            ids,
            weights,
            clamp,
            out,
            &self.matmul_fn(),
        )
    }

    fn swiglu_clamped(&self, gate: &CpuTensor, up: &CpuTensor, clamp: f32, out: &mut CpuTensor) {
        hyper::swiglu_clamped(gate, up, clamp, out);
    }
}
