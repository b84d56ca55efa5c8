//! The DeepSeek V4 forward pass (spec §3.9-3.10) over a batch of
//! sequences, layer-major: every op runs once per layer over all rows of
//! all sequences. Within a layer every position's raw row and every
//! compressed row its position completes are stored before attention, and
//! each row sees only what its position may see (the raw window up to
//! itself, the compressed rows completed at or before it), so a chunk
//! computes exactly what feeding its tokens one by one computes.
//!
//! ```text
//! X = 4 × embed(token)
//! per layer:  x = HC_pre(X); a = rms(x)·attn_norm
//!             q = heads(rms(q_b · rms(q_a · a)·q_norm)), rope
//!             kv = rms(kv · a)·kv_norm, rope  -> raw window
//!             compressor(a) -> compressed row every r tokens (+ indexer row)
//!             o = attend(q | window ∪ compressed[indexer top-k]), inverse rope
//!             X = HC_post(out_b · groups(out_a · o))
//!             x = HC_pre(X); f = rms(x)·ffn_norm
//!             X = HC_post(Σ routed experts(f) + shared(f))
//! logits = output · rms(HC_head(X))·output_norm
//! ```

use ds4_kernels::{
    Backend, Branch, CompressedAttentionConfig, CompressedSeq, CompressorConfig, CompressorKind,
    HcConfig, RouteConfig, TailRope,
};

use super::hparams::{Ds4HParams, N_HC};
use super::numerics::Ds4Numerics;
use super::weights::{CompressorWeights, Ds4Weights, HcWeights};
use crate::families::{Logits, ModelError, PagedInput};

pub struct Ctx<'a, B: Backend> {
    pub h: &'a Ds4HParams,
    pub w: &'a Ds4Weights<B>,
    pub be: &'a B,
    pub rope_plain: &'a TailRope,
    pub rope_comp: &'a TailRope,
    pub num: Ds4Numerics,
}

/// The rows of a batch: tokens, positions and each sequence's part.
struct Rows<'a> {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    seqs: Vec<CompressedSeq<'a>>,
}

impl<'a> Rows<'a> {
    fn of(batch: &[PagedInput<'a>]) -> Rows<'a> {
        let mut r = Rows {
            tokens: Vec::new(),
            positions: Vec::new(),
            seqs: Vec::with_capacity(batch.len()),
        };
        for inp in batch {
            r.seqs.push(CompressedSeq {
                blocks: inp.blocks,
                window: inp.window,
                slot: inp.slot,
                row: r.tokens.len(),
                n_rows: inp.tokens.len(),
                pos: inp.pos,
            });
            r.tokens.extend_from_slice(inp.tokens);
            r.positions
                .extend((inp.pos..inp.pos + inp.tokens.len()).map(|p| p as u32));
        }
        r
    }
}

impl<B: Backend> Ctx<'_, B> {
    fn hc(&self) -> HcConfig {
        HcConfig {
            n_hc: N_HC,
            iters: self.h.sinkhorn_iters,
            eps: self.h.hc_eps,
            norm_eps: self.h.rms_eps,
        }
    }

    fn hc_pre(
        &self,
        hw: &HcWeights<B>,
        xs: &B::Tensor,
        x: &mut B::Tensor,
        split: &mut B::Tensor,
    ) -> Result<(), ModelError> {
        Ok(self
            .be
            .hc_pre(xs, &hw.fn_, &hw.scale, &hw.base, &self.hc(), x, split)?)
    }

    /// One compressor over the batch: projections of `a`, then the pool's
    /// frontier update and row emission.
    #[allow(clippy::too_many_arguments)]
    fn compress(
        &self,
        pool: &mut B::CompressedPool,
        layer: usize,
        rows: &Rows<'_>,
        cw: &CompressorWeights<B>,
        a: &B::Tensor,
        width: usize,
        kind: CompressorKind,
        ratio: usize,
        round: bool,
    ) -> Result<(), ModelError> {
        let be = self.be;
        let n = rows.tokens.len();
        let (mut k, mut s) = (be.tensor(n, width), be.tensor(n, width));
        be.matmul_many(&[&cw.kv, &cw.gate], None, a, &mut [&mut k, &mut s])?;
        let cfg = CompressorConfig {
            kind,
            ratio,
            norm_eps: self.h.rms_eps,
            rope: self.rope_comp.clone(),
            round,
        };
        be.compress(pool, layer, &rows.seqs, &k, &s, &cw.ape, &cw.norm, &cfg)?;
        Ok(())
    }

    pub fn forward(
        &self,
        pool: &mut B::CompressedPool,
        batch: &[PagedInput<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let (h, w, be) = (self.h, self.w, self.be);
        let rows = Rows::of(batch);
        let n = rows.tokens.len();
        if n == 0 {
            return Ok(vec![Vec::new(); batch.len()]);
        }
        let (d, hd) = (h.n_embd, h.head_dim);
        let qw = h.n_head * hd;
        let hc = self.hc();
        let mut xs = be.tensor(n, N_HC * d);
        {
            let mut e = be.tensor(n, d);
            be.embed(&w.token_embd, &rows.tokens, &mut e)?;
            be.hc_expand(&e, N_HC, &mut xs);
        }
        let mut x = be.tensor(n, d);
        let mut split = be.tensor(n, hc.mix_width());

        for (l, lw) in w.layers.iter().enumerate() {
            let r = h.ratios[l];
            let rope = if r == 0 {
                self.rope_plain
            } else {
                self.rope_comp
            };

            // ---- attention sublayer
            self.hc_pre(&lw.hc_attn, &xs, &mut x, &mut split)?;
            let mut a = be.tensor(n, d);
            be.rms_norm(&x, &lw.attn_norm, h.rms_eps, &mut a);
            let (mut q_lat, mut kv) = (be.tensor(n, h.q_lora), be.tensor(n, hd));
            be.matmul_many(&[&lw.q_a, &lw.kv], None, &a, &mut [&mut q_lat, &mut kv])?;
            // The KV row and the compressors beside the query path: they
            // write the pool, which only the indexer's selection and
            // attention read, after the join.
            be.branch(Branch::Beside);
            let mut raw = be.tensor(n, hd);
            be.rms_norm(&kv, &lw.kv_norm, h.rms_eps, &mut raw);
            be.rope_tail(&mut raw, &rows.positions, hd, rope, false);
            if self.num.fp8_kv {
                be.round_fp8(&mut raw, hd, hd - h.n_rot);
            }
            be.window_store(pool, l, &rows.seqs, &raw)?;

            if let Some(cw) = &lw.compressor {
                let width = Ds4HParams::lanes(r) * hd;
                let round = self.num.fp8_kv;
                let kind = CompressorKind::Attention;
                self.compress(pool, l, &rows, cw, &a, width, kind, r, round)?;
            }
            if let Some(iw) = &lw.indexer {
                let (width, round) = (2 * h.idx_dim, self.num.fp4_indexer);
                let kind = CompressorKind::Indexer;
                self.compress(pool, l, &rows, &iw.compressor, &a, width, kind, 4, round)?;
            }
            be.branch(Branch::Main);
            let mut qhat = be.tensor(n, h.q_lora);
            be.rms_norm(&q_lat, &lw.q_a_norm, h.rms_eps, &mut qhat);
            let mut q = be.tensor(n, qw);
            be.matmul(&lw.q_b, &qhat, &mut q)?;
            be.rms_norm_heads(&mut q, hd, h.rms_eps);
            be.rope_tail(&mut q, &rows.positions, hd, rope, false);
            let indexer_q = match &lw.indexer {
                Some(iw) => {
                    let mut qi = be.tensor(n, h.idx_heads * h.idx_dim);
                    be.matmul(&iw.q_b, &qhat, &mut qi)?;
                    let mut wi = be.tensor(n, h.idx_heads);
                    be.matmul(&iw.proj, &a, &mut wi)?;
                    be.rope_tail(&mut qi, &rows.positions, h.idx_dim, self.rope_comp, false);
                    if self.num.fp4_indexer {
                        be.round_indexer(&mut qi, h.idx_dim);
                    }
                    be.scale(&mut wi, 1.0 / ((h.idx_heads * h.idx_dim) as f32).sqrt());
                    Some((qi, wi))
                }
                None => None,
            };
            be.branch(Branch::Join);
            let selected = match &indexer_q {
                Some((qi, wi)) => {
                    let mut sel = be.tensor(n, h.idx_top_k);
                    be.indexer_select(pool, l, &rows.seqs, qi, wi, h.idx_top_k, &mut sel)?;
                    Some(sel)
                }
                None => None,
            };
            let mut att = be.tensor(n, qw);
            let acfg = CompressedAttentionConfig {
                n_head: h.n_head,
                head_dim: hd,
                ratio: r,
                scale: 1.0 / (hd as f32).sqrt(),
            };
            be.compressed_attention(
                &q,
                pool,
                l,
                &rows.seqs,
                selected.as_ref(),
                &lw.sinks,
                &acfg,
                &mut att,
            )?;
            be.rope_tail(&mut att, &rows.positions, hd, rope, true);
            let mut u = be.tensor(n, h.o_groups * h.o_lora);
            be.matmul_grouped(&lw.out_a, &att, h.o_groups, &mut u)?;
            let mut y = be.tensor(n, d);
            be.matmul(&lw.out_b, &u, &mut y)?;
            be.hc_post(&mut xs, &y, &split, &hc);

            // ---- FFN sublayer
            self.hc_pre(&lw.hc_ffn, &xs, &mut x, &mut split)?;
            let mut f = be.tensor(n, d);
            be.rms_norm(&x, &lw.ffn_norm, h.rms_eps, &mut f);
            // The shared expert beside the routed ones (their sum is the
            // first use of its output).
            be.branch(Branch::Beside);
            let (mut g, mut up) = (be.tensor(n, h.n_ff), be.tensor(n, h.n_ff));
            let sh = &lw.shared;
            be.matmul_many(&[&sh.gate, &sh.up], None, &f, &mut [&mut g, &mut up])?;
            let mut m = be.tensor(n, h.n_ff);
            be.swiglu_clamped(&g, &up, h.clamp_shared[l], &mut m);
            let mut shared = be.tensor(n, d);
            be.matmul(&sh.down, &m, &mut shared)?;
            be.branch(Branch::Main);
            let mut logits = be.tensor(n, h.n_expert);
            be.matmul(&lw.router, &f, &mut logits)?;
            let k = h.n_expert_used;
            let (mut ids, mut wts) = (be.tensor(n, k), be.tensor(n, k));
            let route = RouteConfig {
                k,
                scale: h.route_scale,
            };
            let hash = lw.tid2eid.as_ref().map(|t| (t, rows.tokens.as_slice()));
            be.moe_route(
                &logits,
                lw.router_bias.as_ref(),
                hash,
                &route,
                &mut ids,
                &mut wts,
            )?;
            let mut y = be.tensor(n, d);
            let ex = &lw.experts;
            be.moe_experts(
                &ex.gate, &ex.up, &ex.down, h.n_expert, &f, &ids, &wts, h.clamp[l], &mut y,
            )?;
            be.branch(Branch::Join);
            be.add_assign(&mut y, &shared);
            be.hc_post(&mut xs, &y, &split, &hc);
        }

        // ---- output head, for the rows that want logits
        let mut wanted: Vec<(usize, usize)> = Vec::new();
        for (i, (inp, s)) in batch.iter().zip(&rows.seqs).enumerate() {
            match inp.logits {
                Some(Logits::Last) if s.n_rows > 0 => wanted.push((i, s.row + s.n_rows - 1)),
                Some(Logits::All) => wanted.extend((s.row..s.row + s.n_rows).map(|r| (i, r))),
                _ => {}
            }
        }
        let mut out = vec![Vec::new(); batch.len()];
        if wanted.is_empty() {
            return Ok(out);
        }
        let m = wanted.len();
        let mut states = be.tensor(m, N_HC * d);
        for (i, &(_, r)) in wanted.iter().enumerate() {
            be.copy_row(&xs, r, &mut states, i);
        }
        let mut hcol = be.tensor(m, d);
        let ho = &w.hc_out;
        be.hc_head(&states, &ho.fn_, &ho.scale, &ho.base, &hc, &mut hcol)?;
        let mut normed = be.tensor(m, d);
        be.rms_norm(&hcol, &w.output_norm, h.rms_eps, &mut normed);
        let mut logits = be.tensor(m, h.n_vocab);
        be.matmul(&w.output, &normed, &mut logits)?;
        let host = be.to_host(&logits);
        for (row, &(i, _)) in host.chunks_exact(h.n_vocab).zip(&wanted) {
            out[i].extend_from_slice(row);
        }
        Ok(out)
    }
}
