//! Interleaved partial RoPE (spec §3.0): only the last `n_rot` dims of a
//! head rotate, as adjacent pairs `(x[2k], x[2k+1])`. Window-only layers
//! use plain frequencies; compressed layers use YaRN with their own base.

use super::hparams::YarnConfig;

#[derive(Clone, Debug)]
pub struct Rope {
    /// Angular frequency of each pair.
    omega: Vec<f64>,
}

impl Rope {
    pub fn plain(n_rot: usize, base: f64) -> Rope {
        let d = n_rot as f64;
        Rope {
            omega: (0..n_rot / 2)
                .map(|k| base.powf(-2.0 * k as f64 / d))
                .collect(),
        }
    }

    pub fn yarn(n_rot: usize, base: f64, y: &YarnConfig) -> Rope {
        let d = n_rot as f64;
        let corr = |beta: f64| {
            d * (y.orig_ctx / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * base.ln())
        };
        let low = corr(y.beta_fast).floor().max(0.0);
        let high = corr(y.beta_slow).ceil().min(d - 1.0);
        let omega = (0..n_rot / 2)
            .map(|k| {
                let theta = base.powf(-2.0 * k as f64 / d);
                let ramp = 1.0 - ((k as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                theta * ramp + theta / y.factor * (1.0 - ramp)
            })
            .collect();
        Rope { omega }
    }

    /// Rotate the tail of `head` (one head) to position `pos` (or back).
    pub fn apply(&self, head: &mut [f32], pos: usize, inverse: bool) {
        let n_rot = self.omega.len() * 2;
        let start = head.len() - n_rot;
        let sign = if inverse { -1.0 } else { 1.0 };
        for (pair, &w) in head[start..].chunks_exact_mut(2).zip(&self.omega) {
            let phi = sign * pos as f64 * w;
            let (s, c) = phi.sin_cos();
            let (a, b) = (pair[0] as f64, pair[1] as f64);
            pair[0] = (a * c - b * s) as f32;
            pair[1] = (a * s + b * c) as f32;
        }
    }

    /// Rotate every `head_dim`-wide head of `x`.
    pub fn apply_heads(&self, x: &mut [f32], head_dim: usize, pos: usize, inverse: bool) {
        for h in x.chunks_exact_mut(head_dim) {
            self.apply(h, pos, inverse);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_yarn_ramp_bounds() {
        let y = YarnConfig {
            factor: 16.0,
            orig_ctx: 65536.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let r = Rope::yarn(64, 160000.0, &y);
        let theta = |k: usize| 160000f64.powf(-2.0 * k as f64 / 64.0);
        // Pairs up to 15 keep the full frequency, pairs from 25 on are divided by 16.
        assert!((r.omega[15] - theta(15)).abs() < 1e-15);
        assert!((r.omega[25] - theta(25) / 16.0).abs() < 1e-15);
        assert!(r.omega[20] < theta(20) && r.omega[20] > theta(20) / 16.0);
    }

    #[test]
    fn inverse_undoes_rotation() {
        let r = Rope::plain(4, 10000.0);
        let mut v = vec![0.5, -1.0, 1.0, 2.0, 3.0, -0.25];
        let orig = v.clone();
        r.apply(&mut v, 37, false);
        assert_ne!(v, orig);
        assert_eq!(&v[..2], &orig[..2]);
        r.apply(&mut v, 37, true);
        for (a, b) in v.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-6);
        }
    }
}
