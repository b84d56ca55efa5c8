//! Causal multi-head attention with grouped KV heads over a per-sequence
//! KV cache (one contiguous buffer per layer, grown as tokens arrive).
//!
//! With production numerics, cached K and V values are rounded to f16 on
//! write, the precision of llama.cpp's default F16 cache, so the reference
//! backend computes what the fast paths compute; with exact numerics they
//! are kept as computed. Either way they are stored as f32 for clarity.

use rayon::prelude::*;

use super::elementwise::dot_f32;
use super::CpuTensor;
use crate::backend::{AttentionConfig, BackendError};

/// K and V rows of one sequence for every layer.
#[derive(Clone, Debug)]
pub struct CpuKvCache {
    kv_dim: usize,
    ctx: usize,
    /// Round stored values to f16.
    round_f16: bool,
    /// Positions filled, per layer.
    lens: Vec<usize>,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl CpuKvCache {
    pub fn new(n_layer: usize, kv_dim: usize, ctx: usize, round_f16: bool) -> CpuKvCache {
        CpuKvCache {
            kv_dim,
            ctx,
            round_f16,
            lens: vec![0; n_layer],
            k: vec![Vec::new(); n_layer],
            v: vec![Vec::new(); n_layer],
        }
    }

    /// Positions held by every layer.
    pub fn len(&self) -> usize {
        self.lens.iter().copied().min().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn truncate(&mut self, len: usize) {
        for l in 0..self.lens.len() {
            self.lens[l] = self.lens[l].min(len);
            self.k[l].truncate(self.lens[l] * self.kv_dim);
            self.v[l].truncate(self.lens[l] * self.kv_dim);
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(|b| b.len() * 4).sum()
    }

    fn write(
        &mut self,
        layer: usize,
        pos: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), BackendError> {
        if pos >= self.ctx {
            return Err(BackendError::ContextFull { pos, ctx: self.ctx });
        }
        if pos > self.lens[layer] {
            return Err(BackendError::Shape {
                op: "attention",
                detail: format!(
                    "position {pos} skips ahead of the {} cached positions",
                    self.lens[layer]
                ),
            });
        }
        let d = self.kv_dim;
        let end = (pos + 1) * d;
        if self.k[layer].len() < end {
            self.k[layer].resize(end, 0.0);
            self.v[layer].resize(end, 0.0);
        }
        if self.round_f16 {
            store_f16(&mut self.k[layer][pos * d..end], k);
            store_f16(&mut self.v[layer][pos * d..end], v);
        } else {
            self.k[layer][pos * d..end].copy_from_slice(k);
            self.v[layer][pos * d..end].copy_from_slice(v);
        }
        self.lens[layer] = self.lens[layer].max(pos + 1);
        Ok(())
    }
}

/// Copy `src` into `dst`, rounding every value to the nearest f16.
fn store_f16(dst: &mut [f32], src: &[f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = half::f16::from_f32(s).to_f32();
    }
}

#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &CpuTensor,
    k: &CpuTensor,
    v: &CpuTensor,
    cache: &mut CpuKvCache,
    layer: usize,
    positions: &[u32],
    cfg: &AttentionConfig,
    out: &mut CpuTensor,
) -> Result<(), BackendError> {
    let hd = cfg.head_dim;
    let kv_dim = cfg.n_head_kv * hd;
    let shape_ok = q.cols == cfg.n_head * hd
        && k.cols == kv_dim
        && v.cols == kv_dim
        && cache.kv_dim == kv_dim
        && q.rows == positions.len()
        && k.rows == q.rows
        && v.rows == q.rows
        && out.rows == q.rows
        && out.cols == q.cols
        && cfg.n_head_kv > 0
        && cfg.n_head.is_multiple_of(cfg.n_head_kv);
    if !shape_ok {
        return Err(BackendError::Shape {
            op: "attention",
            detail: format!(
                "q [{}, {}], k [{}, {}], v [{}, {}], out [{}, {}], {} positions, {cfg:?}, cache kv_dim {}",
                q.rows, q.cols, k.rows, k.cols, v.rows, v.cols, out.rows, out.cols, positions.len(), cache.kv_dim
            ),
        });
    }
    for (r, &pos) in positions.iter().enumerate() {
        cache.write(layer, pos as usize, k.row(r), v.row(r))?;
    }
    let group = cfg.n_head / cfg.n_head_kv;
    let (kc, vc) = (&cache.k[layer], &cache.v[layer]);
    out.data
        .par_chunks_mut(hd)
        .enumerate()
        .for_each(|(idx, dst)| {
            let (r, h) = (idx / cfg.n_head, idx % cfg.n_head);
            let kvh = h / group;
            let qh = &q.data[r * q.cols + h * hd..r * q.cols + (h + 1) * hd];
            let n = positions[r] as usize + 1;
            let mut scores: Vec<f32> = (0..n)
                .map(|t| {
                    let kt = &kc[t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd];
                    dot_f32(qh, kt) * cfg.scale
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            for s in &mut scores {
                *s = (*s - max).exp();
                sum += *s;
            }
            dst.fill(0.0);
            for (t, &p) in scores.iter().enumerate() {
                let vt = &vc[t * kv_dim + kvh * hd..t * kv_dim + (kvh + 1) * hd];
                let w = p / sum;
                for (d, &x) in dst.iter_mut().zip(vt) {
                    *d += w * x;
                }
            }
        });
    Ok(())
}
