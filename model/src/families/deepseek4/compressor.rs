//! The KV compressor (spec §3.5): every `ratio` tokens it pools the
//! per-token projections of the window, per channel, with a softmax over
//! learned scores, into one compressed row. Ratio 4 uses two lanes of
//! overlapping windows (the previous window's first lane joins the current
//! window's second lane: 8 candidates per channel). The frontier (`kst`,
//! `sst`) holds the partial window between tokens; the emitted rows are the
//! layer's compressed cache.

/// Frontier state and emitted rows of one compressor.
#[derive(Clone, Debug)]
pub struct Compressor {
    pub ratio: usize,
    /// Width of an emitted row.
    pub dim: usize,
    /// 2 for ratio 4, else 1.
    pub lanes: usize,
    /// `lanes·ratio` rows of `lanes·dim` projected values.
    pub kst: Vec<f32>,
    /// Scores matching `kst` (−∞ where empty).
    pub sst: Vec<f32>,
    /// Emitted rows, `n_rows × dim`.
    pub rows: Vec<f32>,
}

impl Compressor {
    pub fn new(ratio: usize, dim: usize) -> Compressor {
        let lanes = if ratio == 4 { 2 } else { 1 };
        let n = lanes * ratio * lanes * dim;
        Compressor {
            ratio,
            dim,
            lanes,
            kst: vec![0.0; n],
            sst: vec![f32::NEG_INFINITY; n],
            rows: Vec::new(),
        }
    }

    pub fn n_rows(&self) -> usize {
        self.rows.len() / self.dim
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.dim..(i + 1) * self.dim]
    }

    /// Feed token `p`'s projection `k` and score `s` (position bias already
    /// added). Returns the pooled row when `p` completes a window.
    pub fn push(&mut self, k: &[f32], s: &[f32], p: usize) -> Option<Vec<f32>> {
        let (r, d, w) = (self.ratio, self.dim, self.lanes * self.dim);
        let slot = if r == 4 { 4 + p % 4 } else { p % r };
        self.kst[slot * w..(slot + 1) * w].copy_from_slice(k);
        self.sst[slot * w..(slot + 1) * w].copy_from_slice(s);
        if !(p + 1).is_multiple_of(r) {
            return None;
        }
        // Candidate (row, column offset) pairs for channel j.
        let cands: Vec<(usize, usize)> = if r == 4 {
            (0..4)
                .map(|i| (i, 0))
                .chain((4..8).map(|i| (i, d)))
                .collect()
        } else {
            (0..r).map(|i| (i, 0)).collect()
        };
        let pooled = (0..d)
            .map(|j| {
                let mx = cands
                    .iter()
                    .map(|&(i, o)| self.sst[i * w + o + j])
                    .fold(f32::NEG_INFINITY, f32::max);
                if mx == f32::NEG_INFINITY {
                    return 0.0;
                }
                let (mut num, mut den) = (0f64, 0f64);
                for &(i, o) in &cands {
                    let e = ((self.sst[i * w + o + j] - mx) as f64).exp();
                    num += e * self.kst[i * w + o + j] as f64;
                    den += e;
                }
                (num / den) as f32
            })
            .collect();
        if r == 4 {
            // The current window becomes the previous one.
            self.kst.copy_within(4 * w..8 * w, 0);
            self.sst.copy_within(4 * w..8 * w, 0);
        }
        Some(pooled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio4_first_row_pools_current_window_second_lane() {
        let mut c = Compressor::new(4, 2);
        let mut out = None;
        for p in 0..4 {
            // lanes: [first(2) | second(2)]
            let k = [p as f32, 0.0, 10.0 + p as f32, 20.0];
            let s = [0.0, 0.0, 0.0, 0.0];
            out = c.push(&k, &s, p);
            if p < 3 {
                assert!(out.is_none());
            }
        }
        // Previous-window scores are −∞: uniform mean of the second lane.
        assert_eq!(out.unwrap(), vec![11.5, 20.0]);
        // Next row: 4 candidates from the first lane of window 0, 4 from window 1.
        let mut out = None;
        for p in 4..8 {
            out = c.push(&[0.0, 0.0, 100.0, 100.0], &[0.0; 4], p);
        }
        assert_eq!(
            out.unwrap(),
            vec![(0.0 + 1.0 + 2.0 + 3.0 + 400.0) / 8.0, 50.0]
        );
    }
}
