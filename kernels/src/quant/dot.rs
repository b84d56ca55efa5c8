//! Dot products of a weight row with a quantized activation row, and the
//! run-time choice between the portable kernels and the SIMD ones.
//!
//! Every weight type has a portable scalar kernel (in its format's module).
//! On x86_64, the first call probes the CPU once and overwrites the entries
//! that have a faster kernel in [`simd_x86`](super::simd_x86); the choice
//! is cached in a `OnceLock` table of function pointers, so the hot path
//! is one atomic load and an indirect call.

use std::sync::OnceLock;

use super::{activation, float, iq2, k_quants, q4, q5, GgmlType};

/// A dot kernel over whole blocks: weight row bytes, activation row bytes.
pub(crate) type DotFn = fn(&[u8], &[u8]) -> f32;

/// One weight row against four activation rows; must equal four [`DotFn`]
/// calls bit for bit.
pub(crate) type Dot4Fn = fn(&[u8], [&[u8]; 4]) -> [f32; 4];

/// Four weight rows against one activation row; must equal four
/// [`DotFn`] calls bit for bit.
pub(crate) type Rows4Fn = fn([&[u8]; 4], &[u8]) -> [f32; 4];

/// The instruction set the dot products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DotIsa {
    /// Portable Rust, auto-vectorized for the build target only.
    Scalar,
    /// x86_64 AVX2 + FMA + F16C kernels for the hot types.
    Avx2,
}

/// One kernel per weight type, indexed by `GgmlType as usize`.
#[derive(Clone, Copy)]
pub(crate) struct DotTable {
    kernels: [DotFn; 17],
    /// Four-row kernels where one exists.
    kernels4: [Option<Dot4Fn>; 17],
    /// Four-weight-row kernels where one exists.
    rows4: [Option<Rows4Fn>; 17],
    /// Bit `ty as usize` is set where a SIMD kernel replaced the scalar one.
    simd: u32,
    pub(crate) isa: DotIsa,
}

impl DotTable {
    /// Installs a SIMD kernel for weight type `ty`.
    pub(crate) fn set_simd(&mut self, ty: GgmlType, f: DotFn) {
        self.kernels[ty as usize] = f;
        self.simd |= 1 << ty as usize;
    }

    /// Installs a four-row kernel for weight type `ty`.
    pub(crate) fn set_simd4(&mut self, ty: GgmlType, f: Dot4Fn) {
        self.kernels4[ty as usize] = Some(f);
    }

    /// Installs a four-weight-row kernel for weight type `ty`.
    pub(crate) fn set_rows4(&mut self, ty: GgmlType, f: Rows4Fn) {
        self.rows4[ty as usize] = Some(f);
    }
}

/// The portable kernels.
const SCALAR: DotTable = {
    let mut kernels: [DotFn; 17] = [float::dot_f32; 17];
    kernels[GgmlType::F32 as usize] = float::dot_f32;
    kernels[GgmlType::F16 as usize] = float::dot_f16;
    kernels[GgmlType::BF16 as usize] = float::dot_bf16;
    kernels[GgmlType::I32 as usize] = float::dot_i32;
    kernels[GgmlType::Q4_0 as usize] = q4::dot_q4_0_q8_0;
    kernels[GgmlType::Q4_1 as usize] = q4::dot_q4_1_q8_1;
    kernels[GgmlType::Q5_0 as usize] = q5::dot_q5_0_q8_0;
    kernels[GgmlType::Q5_1 as usize] = q5::dot_q5_1_q8_1;
    kernels[GgmlType::Q8_0 as usize] = activation::dot_q8_0_q8_0;
    kernels[GgmlType::Q8_1 as usize] = activation::dot_q8_1_q8_1;
    kernels[GgmlType::Q8_K as usize] = activation::dot_q8_k_q8_k;
    kernels[GgmlType::Q2_K as usize] = k_quants::dot_q2_k_q8_k;
    kernels[GgmlType::Q3_K as usize] = k_quants::dot_q3_k_q8_k;
    kernels[GgmlType::Q4_K as usize] = k_quants::dot_q4_k_q8_k;
    kernels[GgmlType::Q5_K as usize] = k_quants::dot_q5_k_q8_k;
    kernels[GgmlType::Q6_K as usize] = k_quants::dot_q6_k_q8_k;
    kernels[GgmlType::IQ2_XXS as usize] = iq2::dot_iq2_xxs_q8_k;
    DotTable {
        kernels,
        kernels4: [None; 17],
        rows4: [None; 17],
        simd: 0,
        isa: DotIsa::Scalar,
    }
};

static ACTIVE: OnceLock<DotTable> = OnceLock::new();

fn active() -> &'static DotTable {
    ACTIVE.get_or_init(|| {
        #[allow(unused_mut)]
        let mut table = SCALAR;
        #[cfg(target_arch = "x86_64")]
        super::simd_x86::install(&mut table);
        table
    })
}

/// The instruction set [`vec_dot`] uses on this machine (probed once).
pub fn dot_isa() -> DotIsa {
    active().isa
}

/// Restricts both rows to the `n` elements the caller asked for, so a
/// kernel never reads past them whatever the slices hold.
#[inline(always)]
fn rows<'a>(ty: GgmlType, n: usize, w: &'a [u8], act: &'a [u8]) -> (&'a [u8], &'a [u8]) {
    let at = ty.vec_dot_type();
    debug_assert_eq!(
        Some(w.len()),
        ty.row_bytes(n),
        "vec_dot: {ty} weight row of {n} elements"
    );
    debug_assert_eq!(
        Some(act.len()),
        at.row_bytes(n),
        "vec_dot: {at} activation row of {n} elements"
    );
    let blocks = n / ty.block_size();
    let wb = blocks * ty.type_size();
    let ab = n / at.block_size() * at.type_size();
    (w.get(..wb).unwrap_or(w), act.get(..ab).unwrap_or(act))
}

/// Dot product of one weight row `w` (type `ty`, `n` elements) with an
/// activation row `act` already quantized to
/// [`ty.vec_dot_type()`](GgmlType::vec_dot_type) (`n` elements).
///
/// `act` must come from [`quantize_row`](super::quantize_row) (its 8-bit
/// quants lie in [-127, 127], which the Q8_0 SIMD kernel relies on, as
/// ggml's does).
///
/// Hot path: lengths are checked with `debug_assert` only. In release
/// builds, wrong lengths give a meaningless result, never out-of-bounds
/// reads.
#[inline]
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, act) = rows(ty, n, w, act);
    (active().kernels[ty as usize])(w, act)
}

/// [`vec_dot`] of one weight row with four activation rows. Equal, bit for
/// bit, to four [`vec_dot`] calls; faster where a four-row kernel exists
/// (the weight block is unpacked once for all four rows), which is what
/// batched prefill uses.
#[inline]
pub fn vec_dot_x4(ty: GgmlType, n: usize, w: &[u8], acts: [&[u8]; 4]) -> [f32; 4] {
    let table = active();
    match table.kernels4[ty as usize] {
        Some(f) => {
            let w = rows(ty, n, w, acts[0]).0;
            f(w, acts.map(|a| rows(ty, n, w, a).1))
        }
        None => acts.map(|a| vec_dot(ty, n, w, a)),
    }
}

/// [`vec_dot`] of four weight rows with one activation row. Equal, bit for
/// bit, to four [`vec_dot`] calls; faster where a four-row kernel exists
/// (the activation block is loaded once for all four rows, and their
/// block sums and scales are worked out together), which is what a
/// single token's matmul uses.
#[inline]
pub fn vec_dot_rows4(ty: GgmlType, n: usize, ws: [&[u8]; 4], act: &[u8]) -> [f32; 4] {
    match active().rows4[ty as usize] {
        Some(f) => f(ws.map(|w| rows(ty, n, w, act).0), rows(ty, n, ws[0], act).1),
        None => ws.map(|w| vec_dot(ty, n, w, act)),
    }
}

/// [`vec_dot`] on the portable kernels, whatever the CPU supports. The
/// reference the SIMD kernels are tested against.
pub fn vec_dot_scalar(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f32 {
    let (w, act) = rows(ty, n, w, act);
    (SCALAR.kernels[ty as usize])(w, act)
}

/// Weight types whose [`vec_dot`] runs a SIMD kernel on this machine.
pub fn simd_dot_types() -> Vec<GgmlType> {
    let table = active();
    GgmlType::ALL
        .into_iter()
        .filter(|&t| table.simd & (1 << t as usize) != 0)
        .collect()
}
