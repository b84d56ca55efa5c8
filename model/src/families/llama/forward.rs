//! The llama forward pass over the backend op interface.
//!
//! ```text
//! x = embed(tokens)
//! per layer:  h = rms_norm(x) · attn_norm
//!             q, k, v = Wq h, Wk h, Wv h;  rope(q), rope(k)
//!             x += Wo · attention(q, k, v | cache)
//!             h = rms_norm(x) · ffn_norm
//!             x += Wdown · (silu(Wgate h) * Wup h)
//! logits = Wout · (rms_norm(x) · output_norm)
//! ```

use ds4_kernels::{AttentionConfig, Backend};

use super::weights::LlamaWeights;
use super::LlamaHParams;
use crate::families::{Logits, ModelError};

pub fn forward<B: Backend>(
    h: &LlamaHParams,
    w: &LlamaWeights<B>,
    be: &B,
    cache: &mut B::KvCache,
    tokens: &[u32],
    positions: &[u32],
    want: Logits,
) -> Result<Vec<f32>, ModelError> {
    let n = tokens.len();
    if n == 0 {
        return Ok(Vec::new());
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
    be.embed(&w.token_embd, tokens, &mut x)?;
    let mut norm = be.tensor(n, h.n_embd);
    let mut q = be.tensor(n, q_dim);
    let mut k = be.tensor(n, kv_dim);
    let mut v = be.tensor(n, kv_dim);
    let mut att = be.tensor(n, q_dim);
    let mut proj = be.tensor(n, h.n_embd);
    let mut gate = be.tensor(n, h.n_ff);
    let mut up = be.tensor(n, h.n_ff);
    let mut act = be.tensor(n, h.n_ff);

    for (layer, lw) in w.layers.iter().enumerate() {
        be.rms_norm(&x, &lw.attn_norm, h.rms_eps, &mut norm);
        be.matmul(&lw.wq, &norm, &mut q)?;
        be.matmul(&lw.wk, &norm, &mut k)?;
        be.matmul(&lw.wv, &norm, &mut v)?;
        be.rope(&mut q, positions, h.head_dim, &h.rope);
        be.rope(&mut k, positions, h.head_dim, &h.rope);
        be.attention(&q, &k, &v, cache, layer, positions, &attn, &mut att)?;
        be.matmul(&lw.wo, &att, &mut proj)?;
        be.add_assign(&mut x, &proj);

        be.rms_norm(&x, &lw.ffn_norm, h.rms_eps, &mut norm);
        be.matmul(&lw.w_gate, &norm, &mut gate)?;
        be.matmul(&lw.w_up, &norm, &mut up)?;
        be.swiglu(&gate, &up, &mut act);
        be.matmul(&lw.w_down, &act, &mut proj)?;
        be.add_assign(&mut x, &proj);
    }

    let rows = match want {
        Logits::All => x,
        Logits::Last => {
            let mut last = be.tensor(1, h.n_embd);
            be.copy_row(&x, n - 1, &mut last, 0);
            last
        }
    };
    let (r, _) = be.dims(&rows);
    let mut normed = be.tensor(r, h.n_embd);
    be.rms_norm(&rows, &w.output_norm, h.rms_eps, &mut normed);
    let mut logits = be.tensor(r, h.n_vocab);
    be.matmul(w.output(), &normed, &mut logits)?;
    Ok(be.to_host(&logits))
}
