//! The DeepSeek V4 forward pass for a chunk of tokens (spec §3.9-3.10),
//! layer-major: projections run for the whole chunk through
//! `Backend::matmul`; the sequential parts (raw window, compressors,
//! indexer selection, attention) run token by token in position order, so
//! a chunk computes exactly what feeding its tokens one by one computes.
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

use ds4_kernels::Backend;

use super::hc::{self, HcSplit};
use super::hparams::{Ds4HParams, N_HC};
use super::numerics::{f16_round, fp8sim64, indexer_qat, rms_norm, Ds4Numerics};
use super::rope::Rope;
use super::state::Ds4State;
use super::weights::{CompressorWeights, Ds4Weights, Expert, HcWeights};
use super::{attention, indexer, moe};
use crate::families::{Logits, ModelError};

pub struct Ctx<'a, B: Backend> {
    pub h: &'a Ds4HParams,
    pub w: &'a Ds4Weights<B>,
    pub be: &'a B,
    pub rope_plain: &'a Rope,
    pub rope_comp: &'a Rope,
    pub num: Ds4Numerics,
}

/// `W · x` for `n` rows of `n_in` values.
fn mm<B: Backend>(
    be: &B,
    w: &B::Weight,
    x: &[f32],
    n: usize,
    n_out: usize,
) -> Result<Vec<f32>, ModelError> {
    let xt = be.tensor_from(n, x.len() / n, x);
    let mut out = be.tensor(n, n_out);
    be.matmul(w, &xt, &mut out)?;
    Ok(be.to_host(&out))
}

fn norm_rows(x: &[f32], width: usize, w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    x.chunks_exact(width)
        .flat_map(|r| rms_norm(r, w, eps))
        .collect()
}

impl<B: Backend> Ctx<'_, B> {
    /// HC pre for every token: the collapsed sublayer inputs and the splits.
    fn hc_pre(
        &self,
        hw: &HcWeights<B>,
        xs: &[f32],
        n: usize,
    ) -> Result<(Vec<f32>, Vec<HcSplit>), ModelError> {
        let h = self.h;
        let flat = norm_rows(xs, N_HC * h.n_embd, None, h.rms_eps);
        let mix = (2 + N_HC) * N_HC;
        let m = mm(self.be, &hw.fn_, &flat, n, mix)?;
        let mut x = Vec::with_capacity(n * h.n_embd);
        let mut splits = Vec::with_capacity(n);
        for (t, mt) in m.chunks_exact(mix).enumerate() {
            let s = hc::split(mt, &hw.scale, &hw.base, h.sinkhorn_iters, h.hc_eps);
            x.extend(hc::collapse(
                &xs[t * N_HC * h.n_embd..(t + 1) * N_HC * h.n_embd],
                &s.pre,
            ));
            splits.push(s);
        }
        Ok((x, splits))
    }

    fn hc_post(&self, xs: &mut [f32], y: &[f32], splits: &[HcSplit]) {
        let d = self.h.n_embd;
        for (t, s) in splits.iter().enumerate() {
            hc::post(
                &mut xs[t * N_HC * d..(t + 1) * N_HC * d],
                &y[t * d..(t + 1) * d],
                s,
            );
        }
    }

    /// Per-token projections and scores (position bias added) of a compressor.
    fn compressor_inputs(
        &self,
        cw: &CompressorWeights<B>,
        a: &[f32],
        n: usize,
        width: usize,
        ratio: usize,
        start: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let k = mm(self.be, &cw.kv, a, n, width)?;
        let mut s = mm(self.be, &cw.gate, a, n, width)?;
        for (t, st) in s.chunks_exact_mut(width).enumerate() {
            let row = (start + t) % ratio;
            st.iter_mut()
                .zip(&cw.ape[row * width..(row + 1) * width])
                .for_each(|(v, b)| *v += b);
        }
        Ok((k, s))
    }

    /// Finish a pooled compressor row: norm, RoPE at the window start, rounding.
    fn finish_row(&self, pooled: &[f32], norm: &[f32], pos: usize, indexer: bool) -> Vec<f32> {
        let mut row = rms_norm(pooled, Some(norm), self.h.rms_eps);
        self.rope_comp.apply(&mut row, pos, false);
        if indexer {
            if self.num.fp4_indexer {
                indexer_qat(&mut row);
            }
        } else if self.num.fp8_kv {
            fp8sim64(&mut row, self.h.head_dim - self.h.n_rot);
        }
        if self.num.f16_cache {
            f16_round(&mut row);
        }
        row
    }

    fn ffn_expert(
        &self,
        e: &Expert<B>,
        f: &[f32],
        n: usize,
        clamp: f32,
        weights: &[f32],
    ) -> Result<Vec<f32>, ModelError> {
        let h = self.h;
        let mut g = mm(self.be, &e.gate, f, n, h.n_ff)?;
        let u = mm(self.be, &e.up, f, n, h.n_ff)?;
        for (t, (gt, ut)) in g
            .chunks_exact_mut(h.n_ff)
            .zip(u.chunks_exact(h.n_ff))
            .enumerate()
        {
            moe::clamped_swiglu(gt, ut, clamp, weights[t]);
        }
        mm(self.be, &e.down, &g, n, h.n_embd)
    }

    pub fn forward(
        &self,
        st: &mut Ds4State,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        let (h, w, be) = (self.h, self.w, self.be);
        let n = tokens.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let d = h.n_embd;
        let hd = h.head_dim;
        let start = st.n_tokens;
        let mut e = be.tensor(n, d);
        be.embed(&w.token_embd, tokens, &mut e)?;
        let e = be.to_host(&e);
        let mut xs: Vec<f32> = e.chunks_exact(d).flat_map(|r| r.repeat(N_HC)).collect();

        for (l, lw) in w.layers.iter().enumerate() {
            let r = h.ratios[l];
            let rope = if r == 0 {
                self.rope_plain
            } else {
                self.rope_comp
            };

            // ---- attention sublayer
            let (x, splits) = self.hc_pre(&lw.hc_attn, &xs, n)?;
            let a = norm_rows(&x, d, Some(&lw.attn_norm), h.rms_eps);
            let q_lat = mm(be, &lw.q_a, &a, n, h.q_lora)?;
            let qhat = norm_rows(&q_lat, h.q_lora, Some(&lw.q_a_norm), h.rms_eps);
            let q = mm(be, &lw.q_b, &qhat, n, h.n_head * hd)?;
            let kv = mm(be, &lw.kv, &a, n, hd)?;
            let kv = norm_rows(&kv, hd, Some(&lw.kv_norm), h.rms_eps);
            let comp_in = match &lw.compressor {
                Some(cw) => {
                    Some(self.compressor_inputs(cw, &a, n, Ds4HParams::lanes(r) * hd, r, start)?)
                }
                None => None,
            };
            let idx_in = match &lw.indexer {
                Some(iw) => {
                    let (ik, is) =
                        self.compressor_inputs(&iw.compressor, &a, n, 2 * h.idx_dim, 4, start)?;
                    let qi = mm(be, &iw.q_b, &qhat, n, h.idx_heads * h.idx_dim)?;
                    let wi = mm(be, &iw.proj, &a, n, h.idx_heads)?;
                    Some((ik, is, qi, wi))
                }
                None => None,
            };

            let qw = h.n_head * hd;
            let mut att = vec![0f32; n * qw];
            for t in 0..n {
                let p = start + t;
                let mut qt = norm_rows(&q[t * qw..(t + 1) * qw], hd, None, h.rms_eps);
                rope.apply_heads(&mut qt, hd, p, false);

                let mut kvt = kv[t * hd..(t + 1) * hd].to_vec();
                rope.apply(&mut kvt, p, false);
                if self.num.fp8_kv {
                    fp8sim64(&mut kvt, hd - h.n_rot);
                }
                if self.num.f16_cache {
                    f16_round(&mut kvt);
                }
                st.raw_row_mut(l, p).copy_from_slice(&kvt);

                let mut selected: Vec<usize> = Vec::new();
                if let (Some(cw), Some((ck, cs))) = (&lw.compressor, &comp_in) {
                    let width = Ds4HParams::lanes(r) * hd;
                    let comp = st.layers[l].attn.as_mut().expect("compressed layer state");
                    if let Some(pooled) = comp.push(
                        &ck[t * width..(t + 1) * width],
                        &cs[t * width..(t + 1) * width],
                        p,
                    ) {
                        let row = self.finish_row(&pooled, &cw.norm, p + 1 - r, false);
                        st.layers[l]
                            .attn
                            .as_mut()
                            .expect("compressed layer state")
                            .rows
                            .extend(row);
                    }
                    selected = (0..(p + 1) / r).collect();
                }
                if let (Some(iw), Some((ik, is, qi, wi))) = (&lw.indexer, &idx_in) {
                    let width = 2 * h.idx_dim;
                    let ic = st.layers[l].index.as_mut().expect("indexer state");
                    if let Some(pooled) = ic.push(
                        &ik[t * width..(t + 1) * width],
                        &is[t * width..(t + 1) * width],
                        p,
                    ) {
                        let row = self.finish_row(&pooled, &iw.compressor.norm, p + 1 - 4, true);
                        ic.rows.extend(row);
                    }
                    let n_vis = (p + 1) / 4;
                    if n_vis > h.idx_top_k {
                        let qiw = h.idx_heads * h.idx_dim;
                        let mut qit = qi[t * qiw..(t + 1) * qiw].to_vec();
                        self.rope_comp.apply_heads(&mut qit, h.idx_dim, p, false);
                        if self.num.fp4_indexer {
                            qit.chunks_exact_mut(h.idx_dim).for_each(indexer_qat);
                        }
                        let scale = 1.0 / ((h.idx_heads * h.idx_dim) as f32).sqrt();
                        let wts: Vec<f32> = wi[t * h.idx_heads..(t + 1) * h.idx_heads]
                            .iter()
                            .map(|v| v * scale)
                            .collect();
                        let keys = &st.layers[l].index.as_ref().expect("indexer state").rows;
                        selected = indexer::select(&qit, &wts, keys, h.idx_dim, n_vis, h.idx_top_k);
                    }
                }

                let ls = &st.layers[l];
                let mut rows: Vec<&[f32]> = (p.saturating_sub(h.window - 1)..=p)
                    .map(|pp| st.raw_row(l, pp))
                    .collect();
                if let Some(comp) = &ls.attn {
                    rows.extend(selected.iter().map(|&c| comp.row(c)));
                }
                let mut o = attention::attend(&qt, &rows, &lw.sinks, hd);
                rope.apply_heads(&mut o, hd, p, true);
                att[t * qw..(t + 1) * qw].copy_from_slice(&o);
            }

            // Grouped output projection.
            let gin = qw / h.o_groups;
            let mut u = vec![0f32; n * h.o_groups * h.o_lora];
            for (g, wa) in lw.out_a.iter().enumerate() {
                let xg: Vec<f32> = (0..n)
                    .flat_map(|t| att[t * qw + g * gin..t * qw + (g + 1) * gin].to_vec())
                    .collect();
                let ug = mm(be, wa, &xg, n, h.o_lora)?;
                for t in 0..n {
                    let dst = t * h.o_groups * h.o_lora + g * h.o_lora;
                    u[dst..dst + h.o_lora].copy_from_slice(&ug[t * h.o_lora..(t + 1) * h.o_lora]);
                }
            }
            let y = mm(be, &lw.out_b, &u, n, d)?;
            self.hc_post(&mut xs, &y, &splits);

            // ---- FFN sublayer
            let (x, splits) = self.hc_pre(&lw.hc_ffn, &xs, n)?;
            let f = norm_rows(&x, d, Some(&lw.ffn_norm), h.rms_eps);
            let logits = mm(be, &lw.router, &f, n, h.n_expert)?;
            let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); h.n_expert];
            for (t, lt) in logits.chunks_exact(h.n_expert).enumerate() {
                let hashed = lw.tid2eid.as_ref().map(|ids| {
                    let k = h.n_expert_used;
                    &ids[tokens[t] as usize * k..(tokens[t] as usize + 1) * k]
                });
                for (ex, wt) in
                    moe::route(lt, &lw.router_bias, hashed, h.n_expert_used, h.route_scale)
                {
                    per_expert[ex].push((t, wt));
                }
            }
            let mut y = vec![0f32; n * d];
            for (ex, list) in per_expert.iter().enumerate() {
                if list.is_empty() {
                    continue;
                }
                let fx: Vec<f32> = list
                    .iter()
                    .flat_map(|&(t, _)| f[t * d..(t + 1) * d].to_vec())
                    .collect();
                let wts: Vec<f32> = list.iter().map(|&(_, wt)| wt).collect();
                let out = self.ffn_expert(&lw.experts[ex], &fx, list.len(), h.clamp[l], &wts)?;
                for (i, &(t, _)) in list.iter().enumerate() {
                    y[t * d..(t + 1) * d]
                        .iter_mut()
                        .zip(&out[i * d..(i + 1) * d])
                        .for_each(|(a, b)| *a += b);
                }
            }
            let shared = self.ffn_expert(&lw.shared, &f, n, h.clamp_shared[l], &vec![1.0; n])?;
            y.iter_mut().zip(&shared).for_each(|(a, b)| *a += b);
            self.hc_post(&mut xs, &y, &splits);
        }
        st.n_tokens += n;

        // ---- output head
        let rows: Vec<usize> = match want {
            Logits::All => (0..n).collect(),
            Logits::Last => vec![n - 1],
        };
        let sw = N_HC * d;
        let states: Vec<f32> = rows
            .iter()
            .flat_map(|&t| xs[t * sw..(t + 1) * sw].to_vec())
            .collect();
        let flat = norm_rows(&states, sw, None, h.rms_eps);
        let m = mm(be, &w.hc_out.fn_, &flat, rows.len(), N_HC)?;
        let mut normed = Vec::with_capacity(rows.len() * d);
        for (i, mi) in m.chunks_exact(N_HC).enumerate() {
            let wts = hc::head_weights(mi, w.hc_out.scale[0], &w.hc_out.base, h.hc_eps);
            let hcol = hc::collapse(&states[i * sw..(i + 1) * sw], &wts);
            normed.extend(rms_norm(&hcol, Some(&w.output_norm), h.rms_eps));
        }
        mm(be, &w.output, &normed, rows.len(), h.n_vocab)
    }
}
