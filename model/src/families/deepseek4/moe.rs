//! Mixture-of-experts routing (spec §3.7): sqrt(softplus) gate scores;
//! hash-routed first layers take their experts from the token id, later
//! layers the top-k of score + selection bias; route weights are the
//! unbiased scores normalized over the chosen experts, times the route
//! scale. Experts are SwiGLU with a clamp on gate (above) and up (both
//! sides).

/// ds4's softplus: `x` above 20, `eˣ` below −20.
fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else if x < -20.0 {
        x.exp()
    } else {
        x.exp().ln_1p()
    }
}

/// Expert ids and route weights for one token.
pub fn route(
    logits: &[f32],
    bias: &[f32],
    hashed: Option<&[u32]>,
    k: usize,
    scale: f32,
) -> Vec<(usize, f32)> {
    let pi: Vec<f64> = logits.iter().map(|&l| softplus(l as f64).sqrt()).collect();
    let chosen: Vec<usize> = match hashed {
        Some(ids) => ids.iter().map(|&e| e as usize).collect(),
        None => {
            let sc: Vec<f64> = pi.iter().zip(bias).map(|(p, b)| p + *b as f64).collect();
            let mut order: Vec<usize> = (0..pi.len()).collect();
            order.sort_by(|&a, &b| sc[b].total_cmp(&sc[a]).then(a.cmp(&b)));
            order.truncate(k);
            order
        }
    };
    let sum: f64 = chosen.iter().map(|&e| pi[e]).sum();
    let den = sum.max(6.103515625e-5);
    chosen
        .into_iter()
        .map(|e| (e, (scale as f64 * pi[e] / den) as f32))
        .collect()
}

/// `silu(min(g, c)) · clamp(u, −c, c) · w`, element-wise into `g`.
pub fn clamped_swiglu(g: &mut [f32], u: &[f32], clamp: f32, w: f32) {
    for (g, &u) in g.iter_mut().zip(u) {
        let gc = g.min(clamp) as f64;
        let uc = u.clamp(-clamp, clamp) as f64;
        *g = (gc / (1.0 + (-gc).exp()) * uc * w as f64) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn biased_selection_unbiased_weights() {
        let logits = [0.0, 1.0, 2.0, -1.0];
        let bias = [0.0, 0.0, 0.0, 10.0];
        let r = route(&logits, &bias, None, 2, 1.5);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        let total: f32 = r.iter().map(|x| x.1).sum();
        assert!((total - 1.5).abs() < 1e-6);
        let h = route(&logits, &bias, Some(&[1, 0]), 2, 1.0);
        assert_eq!(h[0].0, 1);
    }

    #[test]
    fn clamp_limits_gate_and_up() {
        let mut g = [100.0f32];
        clamped_swiglu(&mut g, &[-50.0], 10.0, 1.0);
        let silu10 = 10.0 / (1.0 + (-10.0f64).exp());
        assert!((g[0] as f64 - silu10 * -10.0).abs() < 1e-4);
    }
}
