//! Rotary position embedding (RoFormer, arXiv:2104.09864), in ggml's
//! "normal" (adjacent pairs) and "neox" (split halves) layouts.
//!
//! The angles depend only on the positions and the configuration, which
//! every layer of a pass shares: the cosines and sines of the last
//! positions seen are kept per thread (a pass runs on one thread) and
//! reused, instead of computing them twice per layer.

use std::cell::RefCell;

use super::CpuTensor;
use crate::backend::{RopeConfig, RopeMode};

/// Cosines and sines for some positions under one configuration:
/// `[position][pair]`, `n_rot / 2` pairs per position.
#[derive(Default)]
struct Angles {
    positions: Vec<u32>,
    /// `(n_rot, freq_base, freq_scale)`, the floats as bits.
    key: (usize, u32, u32),
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Angles {
    /// Recompute for `positions` and `cfg` unless they are the ones held.
    fn update(&mut self, positions: &[u32], cfg: &RopeConfig) {
        let key = (cfg.n_rot, cfg.freq_base.to_bits(), cfg.freq_scale.to_bits());
        if self.key == key && self.positions == positions {
            return;
        }
        let half = cfg.n_rot / 2;
        // theta_i = pos * scale * base^(-2i / n_rot)
        let inv_freq: Vec<f64> = (0..half)
            .map(|i| f64::from(cfg.freq_base).powf(-2.0 * i as f64 / cfg.n_rot as f64))
            .collect();
        self.cos.clear();
        self.sin.clear();
        for &pos in positions {
            let p = f64::from(pos) * f64::from(cfg.freq_scale);
            for f in &inv_freq {
                let theta = p * f;
                self.cos.push(theta.cos() as f32);
                self.sin.push(theta.sin() as f32);
            }
        }
        self.positions.clear();
        self.positions.extend_from_slice(positions);
        self.key = key;
    }
}

thread_local! {
    static ANGLES: RefCell<Angles> = RefCell::default();
}

pub fn rope(x: &mut CpuTensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig) {
    assert_eq!(positions.len(), x.rows, "rope: one position per row");
    assert!(x.cols.is_multiple_of(head_dim), "rope: row is whole heads");
    assert!(
        cfg.n_rot <= head_dim && cfg.n_rot.is_multiple_of(2),
        "rope: n_rot"
    );
    let half = cfg.n_rot / 2;
    if half == 0 || x.cols == 0 {
        return;
    }
    ANGLES.with(|a| {
        let mut a = a.borrow_mut();
        a.update(positions, cfg);
        let rows = x.data.chunks_mut(x.cols);
        for ((row, cos), sin) in rows.zip(a.cos.chunks(half)).zip(a.sin.chunks(half)) {
            for head in row.chunks_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = match cfg.mode {
                        RopeMode::Normal => (2 * i, 2 * i + 1),
                        RopeMode::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos[i] - x1 * sin[i];
                    head[b] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    });
}
