//! Per-sequence inference state (spec §4): per layer a raw sliding window
//! of K=V rows, and on compressed layers the compressor frontier with the
//! compressed rows it emitted (plus the indexer's on ratio-4 layers).
//!
//! Everything lives in plain host buffers with fixed row widths so that a
//! paged KV engine can own and move them: the raw window is a ring of
//! `window` rows (slot = position mod window), compressed rows grow by one
//! every `ratio` tokens, frontiers are constant-size. The hyper-connection
//! streams are per token and never carried.

use super::compressor::Compressor;
use super::hparams::Ds4HParams;
use crate::families::PrivateState;

#[derive(Clone, Debug)]
pub struct LayerState {
    /// `window × head_dim` ring of raw K=V rows.
    pub raw: Vec<f32>,
    /// Attention compressor (compressed layers).
    pub attn: Option<Compressor>,
    /// Indexer compressor (ratio-4 layers).
    pub index: Option<Compressor>,
}

#[derive(Clone, Debug)]
pub struct Ds4State {
    pub layers: Vec<LayerState>,
    /// Tokens whose state is held.
    pub n_tokens: usize,
    pub window: usize,
    pub head_dim: usize,
}

impl Ds4State {
    pub fn new(h: &Ds4HParams) -> Ds4State {
        let layers = h
            .ratios
            .iter()
            .map(|&r| LayerState {
                raw: vec![0.0; h.window * h.head_dim],
                attn: (r != 0).then(|| Compressor::new(r, h.head_dim)),
                index: (r == 4).then(|| Compressor::new(4, h.idx_dim)),
            })
            .collect();
        Ds4State {
            layers,
            n_tokens: 0,
            window: h.window,
            head_dim: h.head_dim,
        }
    }

    /// Forget everything (back to an empty sequence).
    pub fn reset(&mut self) {
        for l in &mut self.layers {
            l.raw.fill(0.0);
            for c in [&mut l.attn, &mut l.index].into_iter().flatten() {
                *c = Compressor::new(c.ratio, c.dim);
            }
        }
        self.n_tokens = 0;
    }

    /// The raw row of position `p` in layer `l` (valid for the last
    /// `window` positions).
    pub fn raw_row(&self, l: usize, p: usize) -> &[f32] {
        let s = p % self.window;
        &self.layers[l].raw[s * self.head_dim..(s + 1) * self.head_dim]
    }

    pub fn raw_row_mut(&mut self, l: usize, p: usize) -> &mut [f32] {
        let s = p % self.window;
        &mut self.layers[l].raw[s * self.head_dim..(s + 1) * self.head_dim]
    }
}

impl PrivateState for Ds4State {
    fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    fn reset(&mut self) {
        Ds4State::reset(self)
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}
