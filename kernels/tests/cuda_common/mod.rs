//! Helpers shared by the CUDA parity tests: the backends, deterministic
//! random data and quant blocks, weights bound on either backend, and the
//! relative-error check every parity test reports with.
#![allow(dead_code)]

use std::sync::OnceLock;

use ds4_kernels::cuda::CudaBackend;
use ds4_kernels::quant::{self, GgmlType};
use ds4_kernels::{Backend, CpuBackend, HostBytes, Numerics, WeightSource};

pub fn gpu(numerics: Numerics) -> &'static CudaBackend {
    static PROD: OnceLock<CudaBackend> = OnceLock::new();
    static EXACT: OnceLock<CudaBackend> = OnceLock::new();
    let cell = match numerics {
        Numerics::Production => &PROD,
        Numerics::Exact => &EXACT,
    };
    cell.get_or_init(|| {
        let t = std::time::Instant::now();
        let be = CudaBackend::new(0, numerics).expect("CUDA device 0");
        eprintln!(
            "CudaBackend::new({numerics:?}): sm_{}, {:?}, {:?}",
            be.arch(),
            be.compile_stats(),
            t.elapsed()
        );
        be
    })
}

/// xorshift64*: deterministic test data without a rand dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    pub fn byte(&mut self) -> u8 {
        (self.next() >> 56) as u8
    }
}

pub fn f16_bytes(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// A valid `[rows, cols]` weight of type `ty`: quantized random values
/// where `quantize_row` supports the type, else random blocks whose f16
/// scales are bounded (K-quants, IQ2_XXS).
pub fn weight_bytes(ty: GgmlType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols).expect("whole blocks");
    let mut out = vec![0u8; rows * row_bytes];
    for row in out.chunks_mut(row_bytes) {
        if ty.can_quantize() {
            let x = rng.vec(cols, 1.0);
            quant::quantize_row(ty, &x, row).expect("quantize");
            continue;
        }
        for b in row.iter_mut() {
            *b = rng.byte();
        }
        for blk in row.chunks_mut(ty.type_size()) {
            let d = 0.002 + 0.01 * rng.f().abs();
            let dmin = 0.002 + 0.01 * rng.f().abs();
            match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    blk[0..2].copy_from_slice(&f16_bytes(d));
                    blk[2..4].copy_from_slice(&f16_bytes(dmin));
                }
                GgmlType::Q6_K => blk[208..210].copy_from_slice(&f16_bytes(d * 0.1)),
                // Any scale, quant, grid and sign bytes are valid.
                GgmlType::Q2_K => {
                    blk[80..82].copy_from_slice(&f16_bytes(d));
                    blk[82..84].copy_from_slice(&f16_bytes(dmin));
                }
                GgmlType::IQ2_XXS => blk[0..2].copy_from_slice(&f16_bytes(d)),
                other => panic!("no block generator for {other}"),
            }
        }
    }
    out
}

pub fn bind<B: Backend>(
    be: &B,
    name: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> B::Weight {
    be.bind_weight(WeightSource {
        name: name.into(),
        ggml_type: ty,
        rows,
        cols,
        bytes: HostBytes::from_vec(bytes.to_vec()),
        device: None,
    })
    .unwrap_or_else(|e| panic!("bind {name}: {e}"))
}

/// Little-endian bytes of f32 values (an F32 weight's GGUF bytes).
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A one-row F32 weight (norm scale, bias) bound on both backends.
pub fn row_weight(
    g: &CudaBackend,
    c: &CpuBackend,
    name: &str,
    values: &[f32],
) -> (
    <CudaBackend as Backend>::Weight,
    <CpuBackend as Backend>::Weight,
) {
    let bytes = f32_bytes(values);
    let cols = values.len();
    (
        bind(g, name, GgmlType::F32, 1, cols, &bytes),
        bind(c, name, GgmlType::F32, 1, cols, &bytes),
    )
}

/// Asserts `rel = max|got - want| / max|want| <= tol` and reports it.
pub fn check(name: &str, got: &[f32], want: &[f32], tol: f32) -> f32 {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let mut max_abs = 0.0f32;
    let mut worst = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let d = (g - w).abs();
        if d > max_abs || d.is_nan() {
            max_abs = if d.is_nan() { f32::INFINITY } else { d };
            worst = i;
        }
    }
    let scale = want
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(f32::MIN_POSITIVE);
    let rel = max_abs / scale;
    println!("PARITY {name} max_abs={max_abs:.3e} rel={rel:.3e} tol={tol:.0e}");
    assert!(
        rel <= tol,
        "{name}: rel {rel:e} > {tol:e} (max |diff| {max_abs:e} at {worst}: gpu {} cpu {})",
        got[worst],
        want[worst]
    );
    rel
}
