//! The llama forward pass over the backend op interface, for a batch of
//! sequences at once: every projection is one matmul over the rows of all
//! sequences; attention reads each sequence's own blocks of the KV pool.
//!
//! ```text
//! x = embed(tokens)
//! per layer:  h = rms_norm(x) · attn_norm
//!             q, k, v = Wq h (+ bq), Wk h (+ bk), Wv h (+ bv);  rope(q), rope(k)
//!             x += Wo · attention(q, k, v | cache)
//!             h = rms_norm(x) · ffn_norm
//!             x += Wdown · (silu(Wgate h) * Wup h)
//! logits = Wout · (rms_norm(x) · output_norm)
//! ```
//!
//! A pass of one row (a single sequence's decode step) runs each layer
//! the backend fuses ([`Backend::fuses_dense_layer`]) as one
//! [`Backend::dense_layer`] call instead of its ops.

use ds4_kernels::{AttentionConfig, Backend, DenseLayerConfig, KvSeq};

use super::weights::LlamaWeights;
use super::LlamaHParams;
use crate::families::{Logits, ModelError, PagedInput};

/// Run every input of `batch`; returns, per input, the logits it asked for
/// (`[1 or n_tokens, n_vocab]` row-major; empty when it asked for none).
pub fn forward<B: Backend>(
    h: &LlamaHParams,
    w: &LlamaWeights<B>,
    be: &B,
    pool: &mut B::KvPool,
    batch: &[PagedInput<'_>],
) -> Result<Vec<Vec<f32>>, ModelError> {
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    let mut seqs = Vec::with_capacity(batch.len());
    for input in batch {
        seqs.push(KvSeq {
            blocks: input.blocks,
            row: tokens.len(),
            n_rows: input.tokens.len(),
            pos: input.pos,
        });
        tokens.extend_from_slice(input.tokens);
        positions.extend((input.pos..input.pos + input.tokens.len()).map(|p| p as u32));
    }
    let n = tokens.len();
    if n == 0 {
        return Ok(vec![Vec::new(); batch.len()]);
    }
    let q_dim = h.n_head * h.head_dim;
    let kv_dim = h.n_head_kv * h.head_dim;
    let attn = AttentionConfig {
        n_head: h.n_head,
        n_head_kv: h.n_head_kv,
        head_dim: h.head_dim,
        scale: 1.0 / (h.head_dim as f32).sqrt(),
    };

    let mut x = be.tensor(n, h.n_embd);
    be.embed(&w.token_embd, &tokens, &mut x)?;
    let dense = DenseLayerConfig {
        attn,
        rope: h.rope,
        rms_eps: h.rms_eps,
    };
    // The one sequence of a single-row pass.
    let single = seqs.iter().find(|s| s.n_rows == 1).filter(|_| n == 1);
    let fused: Vec<bool> = w
        .layers
        .iter()
        .map(|lw| {
            single.is_some()
                && lw.qkv_bias.is_none()
                && be.fuses_dense_layer(&lw.dense(), &dense, pool, n)
        })
        .collect();
    // The op-by-op layers' buffers (none when every layer is fused).
    let b = if fused.iter().all(|&f| f) { 0 } else { n };
    let mut norm = be.tensor(b, h.n_embd);
    let mut q = be.tensor(b, q_dim);
    let mut k = be.tensor(b, kv_dim);
    let mut v = be.tensor(b, kv_dim);
    let mut att = be.tensor(b, q_dim);
    let mut proj = be.tensor(b, h.n_embd);
    let mut gate = be.tensor(b, h.n_ff);
    let mut up = be.tensor(b, h.n_ff);
    let mut act = be.tensor(b, h.n_ff);
    // Whether `norm` holds this layer's attention-norm of `x`.
    let mut normed = false;
    for (layer, lw) in w.layers.iter().enumerate() {
        if let Some(seq) = single.filter(|_| fused[layer]) {
            be.dense_layer(&lw.dense(), &dense, &mut x, pool, layer, seq)?;
            continue;
        }
        if !normed {
            be.rms_norm(&x, &lw.attn_norm, h.rms_eps, &mut norm);
        }
        let biases = lw.qkv_bias.as_ref().map(|[bq, bk, bv]| [bq, bk, bv]);
        be.matmul_many(
            &[&lw.wq, &lw.wk, &lw.wv],
            biases.as_ref().map(|b| &b[..]),
            &norm,
            &mut [&mut q, &mut k, &mut v],
        )?;
        be.rope_qk(&mut q, &mut k, &positions, h.head_dim, &h.rope);
        be.attention(&q, &k, &v, pool, layer, &seqs, &attn, &mut att)?;
        be.matmul(&lw.wo, &att, &mut proj)?;
        be.add_rms_norm(&mut x, &proj, &lw.ffn_norm, h.rms_eps, &mut norm);
        be.matmul_many(
            &[&lw.w_gate, &lw.w_up],
            None,
            &norm,
            &mut [&mut gate, &mut up],
        )?;
        be.swiglu(&gate, &up, &mut act);
        be.matmul(&lw.w_down, &act, &mut proj)?;
        // The residual add, fused with the next layer's attention norm
        // when that layer runs op by op.
        normed = match w.layers.get(layer + 1) {
            Some(next) if !fused[layer + 1] => {
                be.add_rms_norm(&mut x, &proj, &next.attn_norm, h.rms_eps, &mut norm);
                true
            }
            _ => {
                be.add_assign(&mut x, &proj);
                false
            }
        };
    }

    // The rows whose logits were asked for, in batch order.
    let mut wanted: Vec<(usize, usize)> = Vec::new(); // (input, row)
    for (i, (input, seq)) in batch.iter().zip(&seqs).enumerate() {
        match input.logits {
            Some(Logits::All) => wanted.extend((seq.row..seq.row + seq.n_rows).map(|r| (i, r))),
            Some(Logits::Last) if seq.n_rows > 0 => wanted.push((i, seq.row + seq.n_rows - 1)),
            _ => {}
        }
    }
    let mut out = vec![Vec::new(); batch.len()];
    if wanted.is_empty() {
        return Ok(out);
    }
    let rows = if wanted.len() == n {
        x
    } else {
        let mut picked = be.tensor(wanted.len(), h.n_embd);
        for (dst, &(_, r)) in wanted.iter().enumerate() {
            be.copy_row(&x, r, &mut picked, dst);
        }
        picked
    };
    let mut normed = be.tensor(wanted.len(), h.n_embd);
    be.rms_norm(&rows, &w.output_norm, h.rms_eps, &mut normed);
    let mut logits = be.tensor(wanted.len(), h.n_vocab);
    be.matmul(w.output(), &normed, &mut logits)?;
    let host = be.to_host(&logits);
    for (row, &(i, _)) in host.chunks_exact(h.n_vocab).zip(&wanted) {
        out[i].extend_from_slice(row);
    }
    Ok(out)
}
