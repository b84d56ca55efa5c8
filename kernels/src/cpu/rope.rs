//! Rotary position embedding (RoFormer, arXiv:2104.09864), in ggml's
//! "normal" (adjacent pairs) and "neox" (split halves) layouts.

use super::CpuTensor;
use crate::backend::{RopeConfig, RopeMode};

pub fn rope(x: &mut CpuTensor, positions: &[u32], head_dim: usize, cfg: &RopeConfig) {
    assert_eq!(positions.len(), x.rows, "rope: one position per row");
    assert!(x.cols.is_multiple_of(head_dim), "rope: row is whole heads");
    assert!(
        cfg.n_rot <= head_dim && cfg.n_rot.is_multiple_of(2),
        "rope: n_rot"
    );
    let half = cfg.n_rot / 2;
    // theta_i = pos * scale * base^(-2i / n_rot)
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| f64::from(cfg.freq_base).powf(-2.0 * i as f64 / cfg.n_rot as f64))
        .collect();
    let mut cos = vec![0.0f32; half];
    let mut sin = vec![0.0f32; half];
    for (row, &pos) in x.data.chunks_mut(x.cols).zip(positions) {
        let p = f64::from(pos) * f64::from(cfg.freq_scale);
        for i in 0..half {
            let theta = p * inv_freq[i];
            cos[i] = theta.cos() as f32;
            sin[i] = theta.sin() as f32;
        }
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
}
