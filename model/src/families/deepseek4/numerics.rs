//! Activation rounding of the reference engine (spec §3.0), used with
//! production numerics: FP8 E4M3 on the non-rotary part of K/V rows, the
//! indexer's Hadamard-128 + FP4 E2M1 "QAT", and F16 storage of cache rows.
//! Exact numerics skip all of them.

/// Which roundings a forward pass applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ds4Numerics {
    /// `fp8sim64` on dims `0..head_dim - n_rot` of raw and compressed K/V rows.
    pub fp8_kv: bool,
    /// Hadamard + `fp4sim32` on indexer queries and indexer key rows.
    pub fp4_indexer: bool,
    /// Raw window rows and compressed rows stored at F16 precision.
    pub f16_cache: bool,
}

impl Ds4Numerics {
    /// The reference engine's serving numerics.
    pub const PRODUCTION: Ds4Numerics = Ds4Numerics {
        fp8_kv: true,
        fp4_indexer: true,
        f16_cache: true,
    };
    /// The model's math: no activation rounding.
    pub const EXACT: Ds4Numerics = Ds4Numerics {
        fp8_kv: false,
        fp4_indexer: false,
        f16_cache: false,
    };
}

/// Nearest value of a sorted non-negative grid; ties go to the even index
/// (the even code, since the grids are listed in code order).
fn round_grid(a: f32, grid: &[f32]) -> f32 {
    let i = grid.partition_point(|&g| g < a).clamp(1, grid.len() - 1);
    let (lo, hi) = (grid[i - 1], grid[i]);
    let (dl, dh) = (a - lo, hi - a);
    if dl > dh || (dl == dh && i % 2 == 0) {
        hi
    } else {
        lo
    }
}

/// E4M3FN magnitudes in code order: 0, subnormals m·2⁻⁹, normals up to 448.
fn e4m3_grid() -> &'static [f32] {
    static GRID: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    GRID.get_or_init(|| {
        let mut g = vec![0.0f32];
        g.extend((1..8).map(|m| m as f32 * (2f32).powi(-9)));
        for e in 1..16 {
            for m in 0..8 {
                let v = (1.0 + m as f32 / 8.0) * (2f32).powi(e - 7);
                if v <= 448.0 {
                    g.push(v);
                }
            }
        }
        g
    })
}

const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Power-of-two block scale `2^ceil(log2(amax / top))`.
fn block_scale(amax: f32, top: f32) -> f32 {
    (2f64).powf((amax as f64 / top as f64).log2().ceil()) as f32
}

fn sim_block(v: &mut [f32], top: f32, min_amax: f32, grid: &[f32]) {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(min_amax);
    let s = block_scale(amax, top);
    for x in v.iter_mut() {
        let q = (*x / s).clamp(-top, top);
        *x = round_grid(q.abs(), grid).copysign(q) * s;
    }
}

/// FP8 E4M3 simulation on each 64-value block of `v[..n_nope]`.
pub fn fp8sim64(v: &mut [f32], n_nope: usize) {
    for b in v[..n_nope].chunks_mut(64) {
        sim_block(b, 448.0, 1e-4, e4m3_grid());
    }
}

/// FP4 E2M1 simulation on each 32-value block.
pub fn fp4sim32(v: &mut [f32]) {
    for b in v.chunks_mut(32) {
        sim_block(b, 6.0, 6.0 * (2f32).powi(-126), &E2M1);
    }
}

/// Normalized Walsh–Hadamard transform (Sylvester order) of a
/// power-of-two-length vector.
pub fn hadamard(v: &mut [f32]) {
    let n = v.len();
    debug_assert!(n.is_power_of_two());
    let mut s = 1;
    while s < n {
        for i in (0..n).step_by(2 * s) {
            for j in i..i + s {
                let (a, b) = (v[j], v[j + s]);
                v[j] = a + b;
                v[j + s] = a - b;
            }
        }
        s *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    v.iter_mut().for_each(|x| *x *= norm);
}

/// The indexer's quantization-aware rounding: Hadamard then FP4.
pub fn indexer_qat(v: &mut [f32]) {
    hadamard(v);
    fp4sim32(v);
}

/// Round to F16 precision (storage of cache rows).
pub fn f16_round(v: &mut [f32]) {
    v.iter_mut()
        .for_each(|x| *x = half::f16::from_f32(*x).to_f32());
}

/// `x / sqrt(mean(x²) + eps)`, times `w` when given (sum of squares in f64).
pub fn rms_norm(x: &[f32], w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
    let scale = (1.0 / (ss / x.len() as f64 + eps as f64).sqrt()) as f32;
    match w {
        Some(w) => x.iter().zip(w).map(|(v, w)| v * scale * w).collect(),
        None => x.iter().map(|v| v * scale).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_grid_has_every_finite_code() {
        let g = e4m3_grid();
        assert_eq!(g.len(), 127);
        assert_eq!(*g.last().unwrap(), 448.0);
        assert_eq!(g[1], 2f32.powi(-9));
    }

    #[test]
    fn fp8_rounds_to_nearest_even_code() {
        // One block whose amax is 448: scale 1, values land on the grid.
        let mut v = vec![0f32; 64];
        v[0] = 448.0;
        v[1] = 1.0625; // halfway between 1.0 (code 56) and 1.125 (code 57): even wins
        v[2] = 1.1;
        v[3] = -3.3;
        fp8sim64(&mut v, 64);
        assert_eq!(v[0], 448.0);
        assert_eq!(v[1], 1.0);
        assert_eq!(v[2], 1.125);
        assert_eq!(v[3], -3.25);
    }

    #[test]
    fn fp4_block_scale_and_ties() {
        let mut v = vec![0f32; 32];
        v[0] = 12.0; // amax 12 -> scale 2 -> 6
        v[1] = 5.0; // 2.5 between 2 (idx 4) and 3 (idx 5): even -> 2 -> 4
        v[2] = -1.3; // -0.65 -> -0.5 -> -1
        fp4sim32(&mut v);
        assert_eq!(&v[..3], &[12.0, 4.0, -1.0]);
    }

    #[test]
    fn hadamard_is_orthonormal() {
        let mut v: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let orig = v.clone();
        hadamard(&mut v);
        hadamard(&mut v);
        for (a, b) in v.iter().zip(&orig) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}
