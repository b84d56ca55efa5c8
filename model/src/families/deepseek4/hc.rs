//! Hyper-connections (spec §3.1-3.3, §3.8): the residual stream is four
//! streams. Before each sublayer a 24-number mix (projection of the
//! RMS-normalized flattened state) gives input weights `pre`, output
//! weights `post` and a stream-mixing matrix made doubly stochastic by
//! Sinkhorn iterations; after it, the state is mixed and the sublayer
//! output added with `post`.

use super::hparams::N_HC;

/// The split of one token's mix.
#[derive(Clone, Debug)]
pub struct HcSplit {
    pub pre: [f32; N_HC],
    pub post: [f32; N_HC],
    /// `comb[a][b]`: weight of source stream `a` in destination stream `b`.
    pub comb: [[f32; N_HC]; N_HC],
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Split a token's mix `m` (24 values) with the sublayer's scales and
/// biases; Sinkhorn with `iters` column normalizations.
pub fn split(m: &[f32], scale: &[f32], base: &[f32], iters: usize, eps: f32) -> HcSplit {
    let eps = eps as f64;
    let mut pre = [0f32; N_HC];
    let mut post = [0f32; N_HC];
    for a in 0..N_HC {
        pre[a] = (sigmoid(m[a] as f64 * scale[0] as f64 + base[a] as f64) + eps) as f32;
        post[a] =
            (2.0 * sigmoid(m[N_HC + a] as f64 * scale[1] as f64 + base[N_HC + a] as f64)) as f32;
    }
    let mut c = [[0f64; N_HC]; N_HC];
    for (a, row) in c.iter_mut().enumerate() {
        for (b, v) in row.iter_mut().enumerate() {
            let i = 2 * N_HC + a * N_HC + b;
            *v = m[i] as f64 * scale[2] as f64 + base[i] as f64;
        }
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        row.iter_mut().for_each(|v| *v = (*v - mx).exp());
        let s: f64 = row.iter().sum();
        row.iter_mut().for_each(|v| *v = *v / s + eps);
    }
    let col_norm = |c: &mut [[f64; N_HC]; N_HC]| {
        let sums: [f64; N_HC] =
            std::array::from_fn(|b| c.iter().map(|row| row[b]).sum::<f64>() + eps);
        for row in c.iter_mut() {
            row.iter_mut().zip(&sums).for_each(|(v, s)| *v /= s);
        }
    };
    col_norm(&mut c);
    for _ in 1..iters {
        for row in c.iter_mut() {
            let s: f64 = row.iter().sum::<f64>() + eps;
            row.iter_mut().for_each(|v| *v /= s);
        }
        col_norm(&mut c);
    }
    let mut comb = [[0f32; N_HC]; N_HC];
    for a in 0..N_HC {
        for b in 0..N_HC {
            comb[a][b] = c[a][b] as f32;
        }
    }
    HcSplit { pre, post, comb }
}

/// `Σ_a w_a · X_a` for one token's state `x` (`N_HC × d`).
pub fn collapse(x: &[f32], w: &[f32; N_HC]) -> Vec<f32> {
    let d = x.len() / N_HC;
    (0..d)
        .map(|i| {
            (0..N_HC)
                .map(|a| w[a] as f64 * x[a * d + i] as f64)
                .sum::<f64>() as f32
        })
        .collect()
}

/// `X'_b = post_b · y + Σ_a comb[a][b] · X_a`, in place.
pub fn post(x: &mut [f32], y: &[f32], s: &HcSplit) {
    let d = y.len();
    for i in 0..d {
        let old: [f64; N_HC] = std::array::from_fn(|a| x[a * d + i] as f64);
        for b in 0..N_HC {
            let mix: f64 = (0..N_HC).map(|a| s.comb[a][b] as f64 * old[a]).sum();
            x[b * d + i] = (s.post[b] as f64 * y[i] as f64 + mix) as f32;
        }
    }
}

/// Output head weights: `σ(m_a · scale + base_a) + eps` (no Sinkhorn).
pub fn head_weights(m: &[f32], scale: f32, base: &[f32], eps: f32) -> [f32; N_HC] {
    std::array::from_fn(|a| {
        (sigmoid(m[a] as f64 * scale as f64 + base[a] as f64) + eps as f64) as f32
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinkhorn_columns_sum_to_one() {
        let m: Vec<f32> = (0..24).map(|i| (i as f32 * 0.7).sin()).collect();
        let s = split(&m, &[0.8, 0.9, 1.0], &[0.1; 24], 20, 1e-6);
        for b in 0..N_HC {
            let col: f32 = (0..N_HC).map(|a| s.comb[a][b]).sum();
            assert!((col - 1.0).abs() < 1e-4, "{col}");
        }
        assert!(s.post.iter().all(|&p| p > 0.0 && p < 2.0));
    }
}
