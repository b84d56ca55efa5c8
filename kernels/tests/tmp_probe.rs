use ds4_kernels::quant::*;
/// splitmix64: a small deterministic generator for test data.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }
}

/// Offsets of the f16 scale fields per block, as in `gen_golden.py`.
fn scale_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ2_XXS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// A weight row of `n` elements: random bytes with plausible f16 scales
/// (every quant bit pattern), or quantized random floats where we can.
fn weight_row(rng: &mut Rng, ty: GgmlType, n: usize, random_bytes: bool) -> Vec<u8> {
    let mut w = vec![0u8; ty.row_bytes(n).unwrap()];
    let random_bytes = random_bytes || !ty.can_quantize();
    if random_bytes && ty.is_quantized() && !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
        for b in w.iter_mut() {
            *b = rng.next() as u8;
        }
        for block in w.chunks_exact_mut(ty.type_size()) {
            for &off in scale_fields(ty) {
                let v = half::f16::from_f32(0.001 + 0.05 * rng.unit().abs());
                block[off..off + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
    } else {
        quantize_row(ty, &rng.floats(n, 2.0), &mut w).unwrap();
    }
    w
}

fn act_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let at = ty.vec_dot_type();
    let mut a = vec![0u8; at.row_bytes(n).unwrap()];
    quantize_row(at, &rng.floats(n, 3.0), &mut a).unwrap();
    a
}

fn dequant(ty: GgmlType, b: &[u8], n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    dequantize_row(ty, b, &mut v).unwrap();
    v
}

/// `sum_i (|w_i| + max|w| over i's block) * |a_i|`.
fn magnitude(ty: GgmlType, w: &[f32], a: &[f32]) -> f64 {
    let bs = ty.block_size().max(32);
    w.chunks(bs)
        .zip(a.chunks(bs))
        .map(|(w, a)| {
            let wmax = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
            w.iter()
                .zip(a)
                .map(|(&w, &a)| (w.abs() as f64 + wmax) * a.abs() as f64)
                .sum::<f64>()
        })
        .sum()
}

/// Bound on the f16 rounding of Q8_1's `s` in ggml's Q4_1/Q5_1 dots.
fn q8_1_sum_term(ty: GgmlType, w: &[u8], a: &[u8]) -> f64 {
    if ty.vec_dot_type() != GgmlType::Q8_1 || ty == GgmlType::Q8_1 {
        return 0.0;
    }
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f64();
    w.chunks_exact(ty.type_size())
        .zip(a.chunks_exact(36))
        .map(|(w, a)| (f16(&w[2..]) * f16(&a[2..])).abs() * 2f64.powi(-10) + 1e-12)
        .sum()
}

fn all_weight_types() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.into_iter()
}


#[test]
fn probe() {
    let mut rng = Rng(9);
    for ty in all_weight_types() {
        let mut worst_ref = 0f64; let mut worst_simd = 0f64;
        for n in [256usize, 512, 1536, 2816] {
            if ty.row_bytes(n).is_none() { continue; }
            for rb in [false, true] {
                let w = weight_row(&mut rng, ty, n, rb);
                let a = act_row(&mut rng, ty, n);
                let wf = dequant(ty, &w, n); let af = dequant(ty.vec_dot_type(), &a, n);
                let exact: f64 = wf.iter().zip(&af).map(|(&x, &y)| x as f64 * y as f64).sum();
                let mag = magnitude(ty, &wf, &af);
                let s = vec_dot(ty, n, &w, &a) as f64; let c = vec_dot_scalar(ty, n, &w, &a) as f64;
                worst_ref = worst_ref.max(((c - exact).abs() - q8_1_sum_term(ty,&w,&a)).max(0.0) / mag);
                worst_simd = worst_simd.max((s - c).abs() / mag);
            }
        }
        println!("{ty:8} ref/mag {worst_ref:.2e} simd-scalar/mag {worst_simd:.2e}");
    }
}
