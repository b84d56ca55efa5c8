//! Multi-row quantized matmul: the previous path (a `vec_dot_x4` /
//! `vec_dot` per weight row, tasks of 32 weight rows, transposed
//! write-back) against the tiled `quant::gemm` path that `cpu::matmul`
//! now uses, on SmolLM2-135M shapes with random valid blocks.
//!
//! Both paths quantize the activations the same way (included in the
//! time). Each cell is the median of several repetitions, measured in the
//! same run; outputs are checked bit-identical.
//!
//! ```text
//! cargo run -p ds4-kernels --release --example matmul_bench [-- ROWS,ROWS,... [SHAPE]]
//! cargo run -p ds4-kernels --release --example matmul_bench -- kernel   # one thread, per shape
//! cargo run -p ds4-kernels --release --example matmul_bench -- cold     # weights from memory
//! ```

use std::time::Instant;

use ds4_kernels::quant::{self, GgmlType};
use rayon::prelude::*;

const ROWS_PER_TASK: usize = 32;

/// Deterministic pseudo-random floats in [-scale, scale).
fn floats(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn quantize_rows(ty: GgmlType, x: &[f32], k: usize) -> Vec<u8> {
    let rb = ty.row_bytes(k).expect("whole blocks");
    let mut q = vec![0u8; x.len() / k * rb];
    q.par_chunks_mut(rb)
        .zip(x.par_chunks(k))
        .for_each(|(d, s)| quant::quantize_row(ty, s, d).expect("quantizable"));
    q
}

/// The activation quantization of the previous path.
fn quantize_act(ty: GgmlType, x: &[f32], k: usize) -> Vec<u8> {
    let at = ty.vec_dot_type();
    if x.len() > k {
        quantize_rows(at, x, k)
    } else {
        let mut q = vec![0u8; at.row_bytes(k).expect("whole blocks")];
        quant::quantize_row(at, x, &mut q).expect("quantizable");
        q
    }
}

/// The activation quantization of the new path, as in `cpu::matmul`.
fn quantize_act_new(ty: GgmlType, x: &[f32], k: usize) -> Vec<u8> {
    let at = ty.vec_dot_type();
    let rb = at.row_bytes(k).expect("whole blocks");
    let mut q = vec![0u8; x.len() / k * rb];
    let quantize = |(s, d): (&[f32], &mut [u8])| {
        quant::quantize_act_row(at, s, d).expect("quantizable");
    };
    if x.len() >= 1 << 15 {
        x.par_chunks(k).zip(q.par_chunks_mut(rb)).for_each(quantize);
    } else {
        x.chunks(k).zip(q.chunks_mut(rb)).for_each(quantize);
    }
    q
}

/// The matmul of before this change (n > 1).
fn old_path(ty: GgmlType, k: usize, w: &[u8], m: usize, x: &[f32], out: &mut [f32]) {
    let n = x.len() / k;
    let act = quantize_act(ty, x, k);
    let wrow = w.len() / m;
    let arow = act.len() / n;
    let act_of = |r: usize| &act[r * arow..(r + 1) * arow];
    let mut t = vec![0.0f32; m * n];
    t.par_chunks_mut(ROWS_PER_TASK * n)
        .enumerate()
        .for_each(|(task, dst)| {
            let base = task * ROWS_PER_TASK;
            for (i, col) in dst.chunks_mut(n).enumerate() {
                let wi = &w[(base + i) * wrow..(base + i + 1) * wrow];
                let mut r = 0;
                while r + 4 <= n {
                    let four = quant::vec_dot_x4(
                        ty,
                        k,
                        wi,
                        [act_of(r), act_of(r + 1), act_of(r + 2), act_of(r + 3)],
                    );
                    col[r..r + 4].copy_from_slice(&four);
                    r += 4;
                }
                for (j, o) in col[r..].iter_mut().enumerate() {
                    *o = quant::vec_dot(ty, k, wi, act_of(r + j));
                }
            }
        });
    for (i, col) in t.chunks(n).enumerate() {
        for (r, &v) in col.iter().enumerate() {
            out[r * m + i] = v;
        }
    }
}

/// The single-row path: one `vec_dot` per weight row, against the row of
/// activations `quantize` makes (`quantize_act`: the path before the
/// vectorized activation quantization; `quantize_act_new`: `cpu::matmul`
/// now).
fn one_row(
    quantize: fn(GgmlType, &[f32], usize) -> Vec<u8>,
    ty: GgmlType,
    k: usize,
    w: &[u8],
    m: usize,
    x: &[f32],
    out: &mut [f32],
) {
    let act = quantize(ty, x, k);
    let wrow = w.len() / m;
    out.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each(|(task, dst)| {
            let base = task * ROWS_PER_TASK;
            for (i, o) in dst.iter_mut().enumerate() {
                *o = quant::vec_dot(ty, k, &w[(base + i) * wrow..(base + i + 1) * wrow], &act);
            }
        });
}

/// Weight rows per task of the new path, as in `cpu::matmul`.
fn rows_per_task(m: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    m.div_ceil(4 * threads).clamp(16, 256).next_multiple_of(8)
}

/// The new path, as in `cpu::matmul` (n > 1).
fn new_path(ty: GgmlType, k: usize, w: &[u8], m: usize, x: &[f32], out: &mut [f32]) {
    let n = x.len() / k;
    let act = quantize_act_new(ty, x, k);
    let wrow = w.len() / m;
    let rows = rows_per_task(m);
    let mut panels = vec![0.0f32; m * n];
    panels
        .par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(task, panel)| {
            let (base, len) = (task * rows, panel.len() / n);
            quant::gemm(
                ty,
                k,
                &w[base * wrow..(base + len) * wrow],
                &act,
                panel,
                len,
            );
        });
    let gather = |(r, dst): (usize, &mut [f32])| {
        for (task, dst) in dst.chunks_mut(rows).enumerate() {
            let len = dst.len();
            let panel = &panels[task * rows * n..];
            dst.copy_from_slice(&panel[r * len..(r + 1) * len]);
        }
    };
    if m * n >= 1 << 16 {
        out.par_chunks_mut(m).enumerate().for_each(gather);
    } else {
        out.chunks_mut(m).enumerate().for_each(gather);
    }
}

/// Medians of `f` and `g`, called alternately so that both see the same
/// background load.
fn median_secs(mut f: impl FnMut(), mut g: impl FnMut()) -> (f64, f64) {
    f(); // warm-up
    g();
    let (mut tf, mut tg) = (Vec::new(), Vec::new());
    let start = Instant::now();
    while tf.len() < 7 || (tf.len() < 41 && start.elapsed().as_secs_f64() < 0.6) {
        let t = Instant::now();
        f();
        tf.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        g();
        tg.push(t.elapsed().as_secs_f64());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    (median(tf), median(tg))
}

/// `kernel`: single-threaded `quant::gemm` alone (activations quantized
/// once), in cycles-independent units: ns per (weight row, token, block).
fn kernel_only() {
    for (ty, k) in [
        (GgmlType::Q8_1, 576),
        (GgmlType::Q8_0, 576),
        (GgmlType::Q8_1, 1536),
    ] {
        let x = floats(9, 512 * k, 2.0);
        let mut q = vec![0u8; 512 * ty.row_bytes(k).unwrap()];
        let t = Instant::now();
        for _ in 0..5 {
            for (s, d) in x.chunks(k).zip(q.chunks_mut(ty.row_bytes(k).unwrap())) {
                quant::quantize_row(ty, s, d).unwrap();
            }
        }
        let per = t.elapsed().as_secs_f64() / 5.0;
        let t = Instant::now();
        for _ in 0..5 {
            for (s, d) in x.chunks(k).zip(q.chunks_mut(ty.row_bytes(k).unwrap())) {
                quant::quantize_act_row(ty, s, d).unwrap();
            }
        }
        let per_new = t.elapsed().as_secs_f64() / 5.0;
        println!(
            "quantize 512 x {k} to {ty} (1 thread): quantize_row {:.3} ms, quantize_act_row {:.3} ms",
            per * 1e3,
            per_new * 1e3
        );
    }
    for (name, ty, m, k) in [
        ("q4_1 1536x576", GgmlType::Q4_1, 1536, 576),
        ("q8_0 1536x576", GgmlType::Q8_0, 1536, 576),
        ("q8_0 49152x576", GgmlType::Q8_0, 49152, 576),
        ("q4_1 49152x576", GgmlType::Q4_1, 49152, 576),
    ] {
        let w = quantize_rows(ty, &floats(3, m * k, 1.0), k);
        for n in [1, 2, 4, 8, 16, 64] {
            let act = quantize_act(ty, &floats(5, n * k, 2.0), k);
            let mut out = vec![0f32; m * n];
            let reps = (20 * 1536 / m).max(1);
            let mut best = f64::MAX;
            for _ in 0..7 {
                let t = Instant::now();
                for _ in 0..reps {
                    quant::gemm(ty, k, &w, &act, &mut out, m);
                }
                best = best.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            let pairs = (m * n * k / 32) as f64;
            println!(
                "{name} n={n:>3}: {:.3} ms, {:.3} ns per pair-block",
                best * 1e3,
                best * 1e9 / pairs
            );
        }
    }
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("cold") {
        // `quant::gemm` alone on one thread over 120 ffn-sized weight
        // matrices (more than the caches hold, so the weights stream from
        // memory as in a forward pass), 8 activation rows, best of 30.
        let (m, k) = (1536, 576);
        let mats: Vec<Vec<u8>> = (0..120)
            .map(|i| quantize_rows(GgmlType::Q4_1, &floats(i, m * k, 1.0), k))
            .collect();
        let act = quantize_act(GgmlType::Q4_1, &floats(5, 8 * k, 2.0), k);
        let mut out = vec![0f32; m * 8];
        let mut best = f64::MAX;
        for _ in 0..30 {
            let t = Instant::now();
            for w in &mats {
                quant::gemm(GgmlType::Q4_1, k, w, &act, &mut out, m);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let pairs = (120 * m * 8 * k / 32) as f64;
        println!(
            "cold q4_1 n=8: {:.3} ms, {:.3} ns per pair-block",
            best * 1e3,
            best * 1e9 / pairs
        );
        return;
    }
    if std::env::args().nth(1).as_deref() == Some("kernel") {
        kernel_only();
        return;
    }
    let ns: Vec<usize> = std::env::args()
        .nth(1)
        .map(|a| {
            a.split(',')
                .map(|v| v.parse().expect("row count"))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 64, 512]);
    let shapes = [
        ("attn_q/o 576x576", GgmlType::Q4_1, 576, 576),
        ("attn_k/v 192x576", GgmlType::Q4_1, 192, 576),
        ("ffn_up 1536x576", GgmlType::Q4_1, 1536, 576),
        ("ffn_down 576x1536", GgmlType::Q4_1, 576, 1536),
        ("output 49152x576", GgmlType::Q8_0, 49152, 576),
    ];
    println!(
        "dot isa {:?}, {} threads; median ms per call, GFLOP/s = 2*m*k*n/t",
        quant::dot_isa(),
        rayon::current_num_threads()
    );
    println!(
        "{:<20} {:>5} {:>10} {:>10} {:>8} {:>8} {:>7}",
        "shape", "n", "old ms", "new ms", "old GF/s", "new GF/s", "speedup"
    );
    let only = std::env::args().nth(2);
    for (name, ty, m, k) in shapes {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let w = quantize_rows(ty, &floats(m as u64 * 31 + k as u64, m * k, 1.0), k);
        for &n in &ns {
            let x = floats(n as u64 + 7, n * k, 2.0);
            let mut a = vec![0f32; n * m];
            let mut b = vec![0f32; n * m];
            let (old, new) = if n == 1 {
                median_secs(
                    || one_row(quantize_act, ty, k, &w, m, &x, &mut a),
                    || one_row(quantize_act_new, ty, k, &w, m, &x, &mut b),
                )
            } else {
                median_secs(
                    || old_path(ty, k, &w, m, &x, &mut a),
                    || new_path(ty, k, &w, m, &x, &mut b),
                )
            };
            let same = a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits());
            assert!(same, "{name} n={n}: outputs differ");
            let gf = |t: f64| 2.0 * (m * k * n) as f64 / t / 1e9;
            println!(
                "{:<20} {:>5} {:>10.3} {:>10.3} {:>8.1} {:>8.1} {:>6.2}x",
                name,
                n,
                old * 1e3,
                new * 1e3,
                gf(old),
                gf(new),
                old / new
            );
        }
    }
}
