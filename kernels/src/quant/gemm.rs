//! Many weight rows × many activation rows: the multi-row matmul kernel,
//! and the activation quantizer that feeds it.
//!
//! [`gemm`] gives, bit for bit, what a [`vec_dot`] per (weight row,
//! activation row) pair gives, but where the tiled kernel runs
//! (`gemm_x86.rs`: Q4_1 and Q8_0 on AVX-512 VNNI) each weight block is
//! unpacked once per group of activation rows, the activation rows are
//! packed once per matmul, and one vector instruction serves sixteen
//! pairs. Other types and CPUs fall back to [`vec_dot_x4`] / [`vec_dot`].
//!
//! [`quantize_act_row`] is [`quantize_row`] for the activation formats,
//! bit for bit, vectorized for Q8_0 and Q8_1.

use super::{quantize_row, vec_dot, vec_dot_x4, GgmlType, QuantError};

/// `out[r * ldo + i] = vec_dot(ty, k, w_i, act_r)` for every weight row
/// `w_i` in `w` (consecutive rows of `ty.row_bytes(k)` bytes) and every
/// activation row `act_r` in `act` (consecutive rows of
/// `ty.vec_dot_type().row_bytes(k)` bytes, from
/// [`quantize_row`]). Bit-identical to those
/// [`vec_dot`] calls.
///
/// # Panics
/// If `k` is not whole blocks, `w` or `act` is not whole rows, or `out`
/// (with row stride `ldo >= m`) is too short.
pub fn gemm(ty: GgmlType, k: usize, w: &[u8], act: &[u8], out: &mut [f32], ldo: usize) {
    assert!(ldo > 0, "gemm: row stride 0");
    let mut rows: Vec<&mut [f32]> = out.chunks_mut(ldo).collect();
    gemm_with(ty, k, w, &GemmAct::new(ty, k, act), &mut rows);
}

/// Activation rows for several [`gemm_with`] calls over different weight
/// rows of one matrix (a matmul split into tasks): the tiled kernel's
/// packing of the rows is made once here instead of once per call.
pub struct GemmAct<'a> {
    act: &'a [u8],
    #[cfg(target_arch = "x86_64")]
    panel: Option<super::gemm_x86::ActPanel>,
}

impl<'a> GemmAct<'a> {
    /// `act`: rows of `k` values in `ty.vec_dot_type()`, as [`gemm`] takes.
    pub fn new(ty: GgmlType, k: usize, act: &'a [u8]) -> GemmAct<'a> {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (ty, k);
        GemmAct {
            act,
            #[cfg(target_arch = "x86_64")]
            panel: super::gemm_x86::ActPanel::new(ty, k, act),
        }
    }
}

/// [`gemm`] over activation rows prepared by [`GemmAct::new`] (with the
/// same `ty` and `k`), into separate output rows: `out[r][i]` for weight
/// row `i` and activation row `r` (each `out[r]` at least as long as the
/// weight rows are many), so that the tasks of a matmul write their
/// columns of the result in place.
///
/// # Panics
/// As [`gemm`]: partial rows, or fewer or shorter output rows than the
/// activation and weight rows.
pub fn gemm_with(ty: GgmlType, k: usize, w: &[u8], a: &GemmAct, out: &mut [&mut [f32]]) {
    let act = a.act;
    let wrow = ty.row_bytes(k).expect("gemm: k is whole weight blocks");
    let arow = ty
        .vec_dot_type()
        .row_bytes(k)
        .expect("gemm: k is whole activation blocks");
    assert!(
        wrow > 0 && arow > 0 && w.len().is_multiple_of(wrow) && act.len().is_multiple_of(arow),
        "gemm: partial rows"
    );
    let (m, n) = (w.len() / wrow, act.len() / arow);
    assert!(
        out.len() >= n && out[..n].iter().all(|r| r.len() >= m),
        "gemm: output too short"
    );
    if tiled(ty, k, w, a, out) {
        return;
    }
    for (i, wi) in w.chunks_exact(wrow).enumerate() {
        let act_of = |r: usize| &act[r * arow..(r + 1) * arow];
        let mut r = 0;
        while r + 4 <= n {
            let four = vec_dot_x4(
                ty,
                k,
                wi,
                [act_of(r), act_of(r + 1), act_of(r + 2), act_of(r + 3)],
            );
            for (j, v) in four.into_iter().enumerate() {
                out[r + j][i] = v;
            }
            r += 4;
        }
        for (r, o) in out.iter_mut().enumerate().take(n).skip(r) {
            o[i] = vec_dot(ty, k, wi, act_of(r));
        }
    }
}

/// [`quantize_row`] for activation rows, bit for bit, faster: Q8_0 and
/// Q8_1 are vectorized on AVX2 (the portable quantizer rounds through a
/// `roundf` call per value); other types go to [`quantize_row`].
pub fn quantize_act_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    #[cfg(target_arch = "x86_64")]
    {
        let done = match ty {
            GgmlType::Q8_0 => super::gemm_x86::quantize_q8(src, dst, false),
            GgmlType::Q8_1 => super::gemm_x86::quantize_q8(src, dst, true),
            _ => false,
        };
        if done {
            return Ok(());
        }
    }
    quantize_row(ty, src, dst)
}

/// Runs the tiled kernel where it takes `ty` on this CPU.
fn tiled(ty: GgmlType, k: usize, w: &[u8], a: &GemmAct, out: &mut [&mut [f32]]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        a.panel
            .as_ref()
            .is_some_and(|p| super::gemm_x86::gemm(ty, k, w, p, out))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, k, w, a, out);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::{floats, quantized};

    /// Weight rows in format `ty`, with an all-zero block and a row of
    /// extreme values mixed in.
    fn weights(ty: GgmlType, m: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut f = floats(seed, m * k, 1.0);
        if m > 2 {
            f[k..k + 32].fill(0.0);
            for (j, v) in f[2 * k..3 * k].iter_mut().enumerate() {
                *v = if j % 3 == 0 { 40.0 } else { -0.001 * j as f32 };
            }
        }
        f.chunks(k).flat_map(|r| quantized(ty, r)).collect()
    }

    /// `quantize_act_row` equals `quantize_row` byte for byte, on random
    /// rows and on blocks made of ties (`v * id` exactly `x.5`), zeros,
    /// signed zeros, subnormals, infinities and NaNs.
    #[test]
    fn quantize_act_row_is_bit_identical_to_quantize_row() {
        let mut rows: Vec<Vec<f32>> = (0..40u64)
            .map(|seed| {
                floats(
                    seed,
                    32 * (1 + seed as usize % 20),
                    10f32.powi(seed as i32 % 7 - 3),
                )
            })
            .collect();
        // amax 127 -> d = 1, id = 1: every x.5 is a tie.
        rows.push(
            (0..32)
                .map(|i| if i == 0 { 127.0 } else { i as f32 * 0.5 - 8.0 })
                .collect(),
        );
        rows.push(
            (0..32)
                .map(|i| if i == 3 { -127.0 } else { -(i as f32) * 0.5 })
                .collect(),
        );
        rows.push(vec![0.0; 32]);
        rows.push(
            (0..32)
                .map(|i| if i % 2 == 0 { -0.0 } else { 0.0 })
                .collect(),
        );
        rows.push(
            (0..32)
                .map(|i| f32::from_bits(i as u32 * 3 + 1) * if i % 3 == 0 { -1.0 } else { 1.0 })
                .collect(),
        );
        rows.push((0..32).map(|i| [1.0, f32::NAN, -2.5, 3.0][i % 4]).collect());
        rows.push(
            (0..32)
                .map(|i| [1.0, f32::INFINITY, -2.5, 3.0][i % 4])
                .collect(),
        );
        rows.push(
            (0..32)
                .map(|i| [f32::NEG_INFINITY, f32::NAN, 0.0, 3.0][i % 4])
                .collect(),
        );
        rows.push(vec![f32::NAN; 32]);
        rows.push((0..32).map(|i| 1e-39 * (i as f32 - 16.0)).collect());
        rows.push((0..32).map(|i| f32::MAX / (i as f32 + 1.0)).collect());
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
            for x in &rows {
                let Some(len) = ty.row_bytes(x.len()) else {
                    continue;
                };
                let mut want = vec![0u8; len];
                let mut got = vec![0xa5u8; len];
                quantize_row(ty, x, &mut want).unwrap();
                quantize_act_row(ty, x, &mut got).unwrap();
                assert_eq!(got, want, "{ty} on {:?}", &x[..8]);
            }
        }
    }

    type Run = Box<dyn Fn(GgmlType, usize, &[u8], &[u8], &mut [f32], usize)>;

    /// [`gemm`], alone and split over two calls sharing the activations.
    fn runs() -> Vec<Run> {
        let runs: Vec<Run> = vec![
            Box::new(gemm),
            // One prepared activation shared by two calls, each over half
            // of the weight rows (as a matmul's tasks share it).
            Box::new(|ty, k, w, act, out, ldo| {
                let wrow = ty.row_bytes(k).unwrap();
                let half = w.len() / wrow / 2;
                let prepared = GemmAct::new(ty, k, act);
                let (mut left, mut right): (Vec<_>, Vec<_>) = out
                    .chunks_mut(ldo)
                    .map(|row| row.split_at_mut(half.min(row.len())))
                    .unzip();
                gemm_with(ty, k, &w[..half * wrow], &prepared, &mut left);
                gemm_with(ty, k, &w[half * wrow..], &prepared, &mut right);
            }),
        ];
        runs
    }

    /// Every output of `gemm` (and of each tiled kernel) equals, bit for
    /// bit, the `vec_dot` of its pair: 1..=17 activation rows (full and
    /// partial tiles) and a few counts over the 64-row chunks, several
    /// widths and weight-row counts.
    #[test]
    fn gemm_is_bit_identical_to_vec_dot() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_1,
        ] {
            let at = ty.vec_dot_type();
            let cases = [32usize, 64, 96, 576, 1536]
                .iter()
                .enumerate()
                .flat_map(|(t, &k)| (1..=17usize).map(move |n| (t, k, n)))
                // Several chunks of activation rows.
                .chain([(0, 64, 64), (1, 96, 69), (2, 576, 133)]);
            for (t, k, n) in cases {
                {
                    let m = [1, 2, 3, 5, 8, 33][(n + t) % 6];
                    let seed = (n * 131 + k * 7 + ty as usize) as u64;
                    let w = weights(ty, m, k, seed);
                    let x = floats(seed ^ 0x5eed, n * k, 3.0);
                    let act: Vec<u8> = x.chunks(k).flat_map(|r| quantized(at, r)).collect();
                    let ldo = m + n % 3;
                    let wrow = ty.row_bytes(k).unwrap();
                    let arow = at.row_bytes(k).unwrap();
                    for run in runs() {
                        let mut out = vec![f32::NAN; n * ldo];
                        run(ty, k, &w, &act, &mut out, ldo);
                        for r in 0..n {
                            for i in 0..m {
                                let want = vec_dot(
                                    ty,
                                    k,
                                    &w[i * wrow..(i + 1) * wrow],
                                    &act[r * arow..(r + 1) * arow],
                                );
                                let got = out[r * ldo + i];
                                assert_eq!(
                                    got.to_bits(),
                                    want.to_bits(),
                                    "{ty} k={k} m={m} n={n} row {r} col {i}: {got} vs {want}"
                                );
                            }
                            for v in &out[r * ldo + m..(r * ldo + ldo).min(out.len())] {
                                assert!(v.is_nan(), "{ty}: wrote past column m");
                            }
                        }
                    }
                }
            }
        }
    }
}
