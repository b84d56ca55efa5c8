//! The lightning indexer (spec §3.6): on ratio-4 layers, when more than
//! `top_k` compressed rows are visible, each query keeps only the `top_k`
//! rows with the highest `Σ_h w_h · relu(qI_h · kI_c)`.

/// Indices (ascending) of the rows a query attends. `qi` is
/// `heads × dim`, `w` the per-head weights (already scaled), `keys` the
/// indexer rows (`≥ n_vis × dim`).
pub fn select(
    qi: &[f32],
    w: &[f32],
    keys: &[f32],
    dim: usize,
    n_vis: usize,
    top_k: usize,
) -> Vec<usize> {
    if n_vis <= top_k {
        return (0..n_vis).collect();
    }
    let scores: Vec<f64> = (0..n_vis)
        .map(|c| {
            let k = &keys[c * dim..(c + 1) * dim];
            qi.chunks_exact(dim)
                .zip(w)
                .map(|(q, &wh)| {
                    let dot: f64 = q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                    wh as f64 * dot.max(0.0)
                })
                .sum()
        })
        .collect();
    let mut order: Vec<usize> = (0..n_vis).collect();
    // Highest first; ties go to the lower row index.
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    order.sort_unstable();
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_best_rows_and_breaks_ties_low() {
        let keys = [1.0, 3.0, 3.0, 2.0];
        let sel = select(&[1.0], &[1.0], &keys, 1, 4, 2);
        assert_eq!(sel, vec![1, 2]);
        let sel = select(&[1.0], &[1.0], &keys, 1, 4, 1);
        assert_eq!(sel, vec![1]);
        assert_eq!(select(&[1.0], &[1.0], &keys, 1, 3, 8), vec![0, 1, 2]);
    }
}
