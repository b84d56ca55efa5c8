//! The op interface (`Backend`) that every family forward pass is written
//! against. The CPU implementation ([`crate::cpu`]) is the reference; other
//! backends are tested against it op by op.
//!
//! Shapes: activations are row-major `[rows, cols]` f32 matrices, one row
//! per token. Weights keep their GGUF layout: a matrix of shape
//! `[n_out, n_in]` (ggml `ne = [n_in, n_out]`) with each row of `n_in`
//! values stored as quant blocks.
//!
//! Files: [`bytes`] (weight bytes), [`config`] (op settings, the dense KV
//! pool, errors), [`compressed`] (the settings of the compressed-attention,
//! hyper-connection and mixture-of-experts ops).

mod bytes;
pub mod compressed;
mod config;

pub use bytes::{DeviceBytes, HostBytes, WeightSource};
pub use compressed::*;
pub use config::*;

/// The operations a family forward pass may use.
pub trait Backend: Send + Sync + 'static {
    /// An activation matrix `[rows, cols]` f32, resident where the backend computes.
    type Tensor: Send;
    /// A bound weight.
    type Weight: Send + Sync;
    /// Paged attention state shared by every sequence (all layers).
    type KvPool: Send;
    /// Compressed-attention state: blocks, window blocks and frontier
    /// slots ([`CompressedPoolConfig`]).
    type CompressedPool: Send;

    fn name(&self) -> &'static str;

    /// How this backend rounds (families that simulate activation rounding
    /// of their reference engine switch it on only for production numerics).
    fn numerics(&self) -> Numerics {
        Numerics::Production
    }

    /// Whether weights live in device memory (bound from
    /// [`WeightSource::device`] in place, or uploaded); host-memory
    /// backends read [`WeightSource::bytes`].
    fn device_resident(&self) -> bool {
        false
    }

    /// Starts timing every kernel one by one (`on`), or stops; either way
    /// returns the table of the profile that was running (kernel, grid,
    /// calls, time), if any. Work recorded before the call is finished
    /// first. Timed kernels run serialized and without graphs: the table
    /// ranks kernels, it does not measure speed. `None` where the backend
    /// has no profiler (the CPU).
    fn profile(&self, on: bool) -> Result<Option<String>, BackendError> {
        let _ = on;
        Ok(None)
    }

    /// Bytes free in the memory the backend allocates KV blocks and scratch
    /// from, when it is not host memory (a GPU's); `None`: host memory.
    fn device_free_memory(&self) -> Option<u64> {
        None
    }

    /// Run `f` (a whole forward pass) where the backend's ops run best:
    /// the CPU backend runs it on one of its compute threads, so that
    /// sequential ops do not compete with idle workers for cores.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Marks where the ops recorded next run (see [`Branch`]): a hint
    /// that never changes results. Backends that run ops one after the
    /// other ignore it.
    fn branch(&self, at: Branch) {
        let _ = at;
    }

    /// Bind a weight (may keep a reference to the host bytes, or upload them).
    fn bind_weight(&self, src: WeightSource) -> Result<Self::Weight, BackendError>;

    /// A zeroed `[rows, cols]` tensor.
    fn tensor(&self, rows: usize, cols: usize) -> Self::Tensor;
    /// A tensor holding `data` (`rows * cols` values).
    fn tensor_from(&self, rows: usize, cols: usize, data: &[f32]) -> Self::Tensor;
    /// Copy a tensor back to host memory, row-major.
    fn to_host(&self, x: &Self::Tensor) -> Vec<f32>;
    /// `(rows, cols)` of a tensor.
    fn dims(&self, x: &Self::Tensor) -> (usize, usize);
    /// Copy row `row` of `src` into row `dst_row` of `dst`.
    fn copy_row(&self, src: &Self::Tensor, row: usize, dst: &mut Self::Tensor, dst_row: usize);

    /// A pool of KV blocks (storage may be allocated lazily, as blocks are
    /// first written).
    fn kv_pool(&self, cfg: KvPoolConfig) -> Result<Self::KvPool, BackendError>;
    /// How `pool` stores values (f16 with production numerics, f32 exact).
    fn kv_dtype(&self, pool: &Self::KvPool) -> KvDtype;
    /// How the pools [`Backend::kv_pool`] makes store values (for sizing
    /// blocks before any pool exists).
    fn kv_pool_dtype(&self) -> KvDtype {
        match self.numerics() {
            Numerics::Production => KvDtype::F16,
            Numerics::Exact => KvDtype::F32,
        }
    }
    /// Copy block `block` to host memory: for each layer, the keys
    /// (`[block_size, kv_dim]`) then the values, little-endian in the pool's
    /// dtype; `out` has [`KvPoolConfig::block_bytes`] bytes.
    fn kv_read_block(
        &self,
        pool: &Self::KvPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError>;
    /// Fill block `block` from bytes laid out as [`Backend::kv_read_block`] writes them.
    fn kv_write_block(
        &self,
        pool: &mut Self::KvPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError>;

    /// `out[i] = table[ids[i]]` (rows of an embedding matrix, dequantized).
    fn embed(
        &self,
        table: &Self::Weight,
        ids: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Row-wise RMSNorm: `out = x / sqrt(mean(x^2) + eps) * w`.
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Weight, eps: f32, out: &mut Self::Tensor);
    /// `out[r] = W · x[r]` for every row `r` (W is `[n_out, n_in]`).
    fn matmul(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `outs[i][r] = ws[i] · x[r] (+ biases[i])`: several weights applied
    /// to one input (q/k/v, gate/up), each optionally followed by
    /// [`Backend::add_bias`]. Backends that prepare the input once per
    /// matmul (quantized activations) prepare it once for all of them.
    fn matmul_many(
        &self,
        ws: &[&Self::Weight],
        biases: Option<&[&Self::Weight]>,
        x: &Self::Tensor,
        outs: &mut [&mut Self::Tensor],
    ) -> Result<(), BackendError> {
        assert_eq!(ws.len(), outs.len(), "matmul_many: one output per weight");
        for (i, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
            self.matmul(w, x, out)?;
            if let Some(b) = biases {
                self.add_bias(out, b[i]);
            }
        }
        Ok(())
    }
    /// `x += y`, then `out = rms_norm(x) · w` (the residual add and the
    /// next norm, in one pass where the backend can).
    fn add_rms_norm(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        w: &Self::Weight,
        eps: f32,
        out: &mut Self::Tensor,
    ) {
        self.add_assign(x, y);
        self.rms_norm(x, w, eps, out);
    }
    /// Rotate each head of every row in place; row `r` is at `positions[r]`.
    fn rope(&self, x: &mut Self::Tensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig);
    /// [`Backend::rope`] of the queries and the keys of the same rows (one
    /// pass where the backend can).
    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        cfg: &RopeConfig,
    ) {
        self.rope(q, positions, head_dim, cfg);
        self.rope(k, positions, head_dim, cfg);
    }
    /// For each sequence of `seqs`: store its `k`, `v` rows at its positions
    /// in layer `layer` of `pool`, then causal attention of its `q` rows
    /// over its positions `0 ..= pos + r` into `out`. Sequences must not
    /// share the blocks they write.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        pool: &mut Self::KvPool,
        layer: usize,
        seqs: &[KvSeq<'_>],
        cfg: &AttentionConfig,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Whether [`Backend::dense_layer`] runs `layer` for a pass of `rows`
    /// rows into `pool` (a fused kernel for its shape and weight types).
    fn fuses_dense_layer(
        &self,
        layer: &DenseLayer<'_, Self::Weight>,
        cfg: &DenseLayerConfig,
        pool: &Self::KvPool,
        rows: usize,
    ) -> bool {
        let _ = (layer, cfg, pool, rows);
        false
    }
    /// The whole of `layer` (see [`DenseLayer`]) for the one row of `x`,
    /// the single row of sequence `seq`, storing its key and value in layer
    /// `index` of `pool`: the ops a forward pass would run, in one step of
    /// the backend's own. Only where [`Backend::fuses_dense_layer`] said so.
    #[allow(clippy::too_many_arguments)]
    fn dense_layer(
        &self,
        layer: &DenseLayer<'_, Self::Weight>,
        cfg: &DenseLayerConfig,
        x: &mut Self::Tensor,
        pool: &mut Self::KvPool,
        index: usize,
        seq: &KvSeq<'_>,
    ) -> Result<(), BackendError> {
        let _ = (layer, cfg, x, pool, index, seq);
        Err(BackendError::Shape {
            op: "dense_layer",
            detail: format!("the {} backend has no fused decoder layer", self.name()),
        })
    }
    /// `out = silu(gate) * up`, element-wise.
    fn swiglu(&self, gate: &Self::Tensor, up: &Self::Tensor, out: &mut Self::Tensor);
    /// `x += y`, element-wise.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor);
    /// `x[r] += bias` for every row `r` (a one-row f32 weight as wide as
    /// `x`: the q/k/v biases of qwen2).
    fn add_bias(&self, x: &mut Self::Tensor, bias: &Self::Weight);

    // ---- hyper-connections, tail RoPE, activation rounding

    /// The streams of every row at the start: `out[r]` (`[rows, n_hc·d]`)
    /// is `n_hc` copies of `x[r]` (`[rows, d]`).
    fn hc_expand(&self, x: &Self::Tensor, n_hc: usize, out: &mut Self::Tensor);

    /// Hyper-connection "pre" of every row of `x` (`[rows, n_hc·d]`, the
    /// row's streams one after the other): the mix
    /// `m = mix · (x / sqrt(mean(x²) + norm_eps))` (`mix` is
    /// `[mix_width, n_hc·d]`), split into `pre_a = σ(m_a·scale[0] + base_a)
    /// + eps`, `post_b = 2·σ(m_{n_hc+b}·scale[1] + base_{n_hc+b})` and the
    /// mixing matrix `C[a][b]` from the logits `m_{2n_hc+a·n_hc+b}·scale[2]
    /// + base_…` by a row softmax (+ eps) and Sinkhorn normalization (see
    /// [`HcConfig::iters`]); `out[r] = Σ_a pre_a · X_a` (`[rows, d]`) and
    /// `split[r]` = pre, post, then C row-major (`[rows, mix_width]`), for
    /// [`Backend::hc_post`].
    #[allow(clippy::too_many_arguments)]
    fn hc_pre(
        &self,
        x: &Self::Tensor,
        mix: &Self::Weight,
        scale: &Self::Weight,
        base: &Self::Weight,
        cfg: &HcConfig,
        out: &mut Self::Tensor,
        split: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Hyper-connection "post": `X'_b = post_b · y + Σ_a C[a][b] · X_a` for
    /// every row, in place in `x` (`[rows, n_hc·d]`; `y` is `[rows, d]`,
    /// `split` from [`Backend::hc_pre`]).
    fn hc_post(&self, x: &mut Self::Tensor, y: &Self::Tensor, split: &Self::Tensor, cfg: &HcConfig);
    /// The output head's collapse of the streams: with `m` the mix as in
    /// [`Backend::hc_pre`] (`mix` is `[n_hc, n_hc·d]`),
    /// `w_a = σ(m_a·scale[0] + base_a) + eps` and `out = Σ_a w_a · X_a`.
    #[allow(clippy::too_many_arguments)]
    fn hc_head(
        &self,
        x: &Self::Tensor,
        mix: &Self::Weight,
        scale: &Self::Weight,
        base: &Self::Weight,
        cfg: &HcConfig,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// RMSNorm without weight of every `head_dim`-wide head of every row,
    /// in place (sum of squares in f64 on the CPU).
    fn rms_norm_heads(&self, x: &mut Self::Tensor, head_dim: usize, eps: f32);
    /// Rotate the tail of every `head_dim`-wide head of row `r` to position
    /// `positions[r]` ([`TailRope`]), or back when `inverse`.
    fn rope_tail(
        &self,
        x: &mut Self::Tensor,
        positions: &[u32],
        head_dim: usize,
        rope: &TailRope,
        inverse: bool,
    );
    /// The reference engine's FP8 E4M3 rounding of K/V rows: in every
    /// `width`-wide piece of every row, each block of 64 values among the
    /// first `n_round` is scaled by `2^ceil(log2(amax/448))` (amax ≥ 1e-4),
    /// rounded to the nearest E4M3FN value (ties to even) and scaled back.
    fn round_fp8(&self, x: &mut Self::Tensor, width: usize, n_round: usize);
    /// The indexer's rounding of every `dim`-wide head of every row (`dim`
    /// a power of two): the normalized Walsh-Hadamard transform, then FP4
    /// E2M1 rounding of each block of 32 with a power-of-two scale
    /// `2^ceil(log2(amax/6))`.
    fn round_indexer(&self, x: &mut Self::Tensor, dim: usize);
    /// Round every value to f16 precision.
    fn round_f16(&self, x: &mut Self::Tensor);
    /// `out[r] = x[r] · s` for every row.
    fn scale(&self, x: &mut Self::Tensor, s: f32);

    // ---- compressed attention state

    /// A compressed-attention pool (storage may be allocated lazily). Rows
    /// are stored in f16 or f32 ([`CompressedPoolConfig::f16_rows`]);
    /// slots and carries in f32.
    fn compressed_pool(
        &self,
        cfg: &CompressedPoolConfig,
    ) -> Result<Self::CompressedPool, BackendError>;
    /// Start `slot`'s frontiers for a sequence at a block boundary: empty
    /// (a fresh sequence), or from the carry of `window` (the window block
    /// of the block before the boundary) when resuming a shared prefix.
    fn compressed_begin(
        &self,
        pool: &mut Self::CompressedPool,
        slot: u32,
        window: Option<u32>,
    ) -> Result<(), BackendError>;
    /// Store every sequence's raw rows of `layer` (`kv`, one per row) at
    /// their positions in its window blocks.
    fn window_store(
        &self,
        pool: &mut Self::CompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        kv: &Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Run one compressor of `layer` over every sequence's rows in
    /// position order: each position's values `k` and scores `s`
    /// (`[rows, lanes·dim]`; the position bias `ape[p mod ratio]` is added
    /// here) enter the frontier; a position completing a window
    /// (`(p + 1) mod ratio = 0`) pools it (a per-channel softmax of the
    /// scores weighting the values; ratio 4 over the previous window's
    /// first lane and the current window's second lane), normalizes the
    /// pooled row (RMSNorm · `norm`), rotates it to the window's first
    /// position, rounds it ([`CompressorConfig::round`]) and stores it in
    /// its block. A ratio-4 compressor finishing a block also writes its
    /// previous-window lane to that block's window block (the carry).
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        pool: &mut Self::CompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        k: &Self::Tensor,
        s: &Self::Tensor,
        ape: &Self::Weight,
        norm: &Self::Weight,
        cfg: &CompressorConfig,
    ) -> Result<(), BackendError>;
    /// The lightning indexer's choice for every row: with `q` the row's
    /// indexer queries (`[rows, heads·index_dim]`, rotated and rounded)
    /// and `w` its head weights (`[rows, heads]`, scaled), the score of
    /// each indexer row `c` visible at the row's position `p`
    /// (`c < (p + 1) / 4`) is `Σ_h w_h · max(0, q_h · key_c)`; `out[r]`
    /// (`[rows, top_k]`) gets the `top_k` best row indices in ascending
    /// order (ties to the lower index), or all visible rows when there are
    /// no more than `top_k`, as f32 values, padded with −1.
    #[allow(clippy::too_many_arguments)]
    fn indexer_select(
        &self,
        pool: &Self::CompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        q: &Self::Tensor,
        w: &Self::Tensor,
        top_k: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Attention of every row's `n_head` query heads (`q`, `[rows,
    /// n_head·head_dim]`) over one shared K=V row per key: the raw rows of
    /// positions `max(0, p − window + 1) ..= p`, then the layer's pooled
    /// rows visible at `p` (all of them, or those `selected` lists, −1
    /// entries skipped); scores `scale · q·k`, the head's `sinks` logit
    /// joining the softmax denominator only.
    #[allow(clippy::too_many_arguments)]
    fn compressed_attention(
        &self,
        q: &Self::Tensor,
        pool: &Self::CompressedPool,
        layer: usize,
        seqs: &[CompressedSeq<'_>],
        selected: Option<&Self::Tensor>,
        sinks: &Self::Weight,
        cfg: &CompressedAttentionConfig,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Copy block `block` to host memory (the layout of
    /// [`CompressedPoolConfig::block_values`], little-endian in the pool's
    /// row dtype).
    fn compressed_read_block(
        &self,
        pool: &Self::CompressedPool,
        block: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError>;
    /// Fill block `block` from bytes laid out as
    /// [`Backend::compressed_read_block`] writes them.
    fn compressed_write_block(
        &self,
        pool: &mut Self::CompressedPool,
        block: u32,
        data: &[u8],
    ) -> Result<(), BackendError>;
    /// Copy window block `window` to host memory: its raw rows
    /// ([`CompressedPoolConfig::window_raw_values`] in the row dtype), then
    /// its carry (f32).
    fn window_read(
        &self,
        pool: &Self::CompressedPool,
        window: u32,
        out: &mut [u8],
    ) -> Result<(), BackendError>;
    /// Fill window block `window` from bytes laid out as
    /// [`Backend::window_read`] writes them.
    fn window_write(
        &self,
        pool: &mut Self::CompressedPool,
        window: u32,
        data: &[u8],
    ) -> Result<(), BackendError>;

    // ---- projections and mixtures of experts

    /// Grouped projection: `w` (`[groups·m, n]`) in `groups` row blocks;
    /// block `g` multiplies columns `g·n .. (g + 1)·n` of `x` (`[rows,
    /// groups·n]`) into columns `g·m .. (g + 1)·m` of `out`.
    fn matmul_grouped(
        &self,
        w: &Self::Weight,
        x: &Self::Tensor,
        groups: usize,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Routing of every row: `π_e = sqrt(softplus(logits_e))`; the experts
    /// are `hash`'s row for the row's token (a `[n_tokens, k]` i32 table,
    /// `tokens[r]`) or the `k` best `π_e + bias_e` (ties to the lower
    /// index); weights `scale · π_e / max(Σ_chosen π, 6.103515625e-5)`.
    /// `ids` and `weights` are `[rows, k]` (ids as f32 values).
    #[allow(clippy::too_many_arguments)]
    fn moe_route(
        &self,
        logits: &Self::Tensor,
        bias: Option<&Self::Weight>,
        hash: Option<(&Self::Weight, &[u32])>,
        cfg: &RouteConfig,
        ids: &mut Self::Tensor,
        weights: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// Routed experts of every row: `out[r] = Σ_i down_e · (silu(min(g, c))
    /// · clamp(u, −c, c) · weights[r][i])` with `g = gate_e · x[r]`,
    /// `u = up_e · x[r]`, `e = ids[r][i]`, `c = clamp`. `gate` and `up` are
    /// `[n_expert·n_ff, d]`, `down` `[n_expert·d, n_ff]`: expert `e` is row
    /// block `e` of each.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        gate: &Self::Weight,
        up: &Self::Weight,
        down: &Self::Weight,
        n_expert: usize,
        x: &Self::Tensor,
        ids: &Self::Tensor,
        weights: &Self::Tensor,
        clamp: f32,
        out: &mut Self::Tensor,
    ) -> Result<(), BackendError>;
    /// `out = silu(min(gate, c)) · clamp(up, −c, c)`, element-wise.
    fn swiglu_clamped(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        clamp: f32,
        out: &mut Self::Tensor,
    );
}
