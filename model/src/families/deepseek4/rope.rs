//! The frequencies of DeepSeek V4's interleaved partial RoPE (spec §3.0):
//! only the last `n_rot` dims of a head rotate, as adjacent pairs
//! `(x[2k], x[2k+1])` (`Backend::rope_tail`). Window-only layers use
//! plain frequencies; compressed layers use YaRN with their own base.

use ds4_kernels::TailRope;

use super::hparams::YarnConfig;

/// `ω_k = base^(−2k/n_rot)`.
pub fn plain(n_rot: usize, base: f64) -> TailRope {
    let d = n_rot as f64;
    TailRope {
        omega: (0..n_rot / 2)
            .map(|k| base.powf(-2.0 * k as f64 / d))
            .collect(),
    }
}

/// YaRN: full frequency below the ramp, divided by the factor above it,
/// blended linearly between.
pub fn yarn(n_rot: usize, base: f64, y: &YarnConfig) -> TailRope {
    let d = n_rot as f64;
    let corr =
        |beta: f64| d * (y.orig_ctx / (2.0 * std::f64::consts::PI * beta)).ln() / (2.0 * base.ln());
    let low = corr(y.beta_fast).floor().max(0.0);
    let high = corr(y.beta_slow).ceil().min(d - 1.0);
    TailRope {
        omega: (0..n_rot / 2)
            .map(|k| {
                let theta = base.powf(-2.0 * k as f64 / d);
                let ramp = 1.0 - ((k as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
                theta * ramp + theta / y.factor * (1.0 - ramp)
            })
            .collect(),
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
        let r = yarn(64, 160000.0, &y);
        let theta = |k: usize| 160000f64.powf(-2.0 * k as f64 / 64.0);
        // Pairs up to 15 keep the full frequency, pairs from 25 on are divided by 16.
        assert!((r.omega[15] - theta(15)).abs() < 1e-15);
        assert!((r.omega[25] - theta(25) / 16.0).abs() < 1e-15);
        assert!(r.omega[20] < theta(20) && r.omega[20] > theta(20) / 16.0);
        assert_eq!(plain(64, 10000.0).omega.len(), 32);
    }
}
