//! Attention over the visible key set with a per-head sink (spec §3.4
//! steps 5-6): one shared K=V vector per row, scores scaled by
//! `1/sqrt(head_dim)`, the sink logit adding mass to the denominator only.

/// `q` is `n_head × head_dim`; `rows` are the visible K=V rows. Returns
/// the `n_head × head_dim` output.
pub fn attend(q: &[f32], rows: &[&[f32]], sinks: &[f32], head_dim: usize) -> Vec<f32> {
    let scale = 1.0 / (head_dim as f64).sqrt();
    let mut out = vec![0f32; q.len()];
    let mut z = vec![0f64; rows.len()];
    for ((qh, oh), &sink) in q
        .chunks_exact(head_dim)
        .zip(out.chunks_exact_mut(head_dim))
        .zip(sinks)
    {
        for (zj, k) in z.iter_mut().zip(rows) {
            *zj = qh
                .iter()
                .zip(k.iter())
                .map(|(a, b)| *a as f64 * *b as f64)
                .sum::<f64>()
                * scale;
        }
        let mx = z.iter().cloned().fold(sink as f64, f64::max);
        let mut den = (sink as f64 - mx).exp();
        let mut acc = vec![0f64; head_dim];
        for (zj, k) in z.iter().zip(rows) {
            let e = (zj - mx).exp();
            den += e;
            acc.iter_mut()
                .zip(k.iter())
                .for_each(|(a, v)| *a += e * *v as f64);
        }
        oh.iter_mut()
            .zip(&acc)
            .for_each(|(o, a)| *o = (a / den) as f32);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_only_scales_the_output() {
        let k = [1.0f32, 2.0];
        let rows: Vec<&[f32]> = vec![&k];
        // One row, score 0, sink 0: weight 1/2.
        let o = attend(&[0.0, 0.0], &rows, &[0.0], 2);
        assert_eq!(o, vec![0.5, 1.0]);
    }
}
