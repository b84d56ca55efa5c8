//! Host-side helpers over logits used by samplers: softmax, top-k, argmax.

/// Index of the largest value (the first one on ties); `None` when empty.
pub fn argmax(x: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in x.iter().enumerate() {
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map(|(i, _)| i)
}

/// The `k` largest values as `(index, value)`, largest first; ties keep
/// the lower index first. NaNs are ignored.
pub fn top_k(x: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<(u32, f32)> = x
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.is_nan())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    let k = k.min(idx.len());
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, order);
    }
    idx.truncate(k);
    idx.sort_by(order);
    idx
}

/// Softmax in place (numerically stable); returns log-sum-exp.
pub fn softmax(x: &mut [f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    for v in x.iter_mut() {
        *v = (f64::from(*v) / sum) as f32;
    }
    max + sum.ln() as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_orders_and_breaks_ties_by_index() {
        let x = [1.0, 5.0, 3.0, 5.0, f32::NAN, -2.0];
        assert_eq!(top_k(&x, 3), vec![(1, 5.0), (3, 5.0), (2, 3.0)]);
        assert_eq!(top_k(&x, 99).len(), 5);
        assert_eq!(argmax(&x), Some(1));
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn softmax_sums_to_one_and_returns_lse() {
        let mut x = [1.0f32, 2.0, 3.0];
        let lse = softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        let want = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
        assert!((f64::from(lse) - want).abs() < 1e-5);
        assert!(x[2] > x[1] && x[1] > x[0]);
    }
}
