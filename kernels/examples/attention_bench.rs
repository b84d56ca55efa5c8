//! Decode attention alone on SmolLM2-135M's shape (9 query heads, 3 KV
//! heads of 64, 30 layers, blocks of 16): `S` sequences of `C` cached
//! positions, one new row each, every layer, as one engine step makes it.
//! Prints the best ms per step of `REPS` with the cache warm (just
//! written) and cold (after sweeping a buffer larger than the caches, as
//! the weights do between layers).
//!
//! ```text
//! cargo run -p ds4-kernels --release --example attention_bench [-- SEQS CTX [BLOCK [REPS]]]
//! ```

use std::time::Instant;

use ds4_kernels::{AttentionConfig, Backend, CpuBackend, KvPoolConfig, KvSeq};

fn main() {
    let mut args = std::env::args()
        .skip(1)
        .map(|a| a.parse::<usize>().expect("a count"));
    let seqs = args.next().unwrap_or(8);
    let ctx = args.next().unwrap_or(128);
    let bs = args.next().unwrap_or(16);
    let reps = args.next().unwrap_or(15);
    let (n_layer, n_head, n_head_kv, hd) = (30, 9, 3, 64);
    let kv_dim = n_head_kv * hd;
    let be = CpuBackend::new();
    let per_seq = (ctx + 1).div_ceil(bs);
    let mut pool = be
        .kv_pool(KvPoolConfig {
            n_layer,
            kv_dim,
            block_size: bs,
            n_blocks: seqs * per_seq,
        })
        .expect("pool");
    let cfg = AttentionConfig {
        n_head,
        n_head_kv,
        head_dim: hd,
        scale: 0.125,
    };
    let tables: Vec<Vec<u32>> = (0..seqs)
        .map(|s| (0..per_seq).map(|b| (b * seqs + s) as u32).collect())
        .collect();
    // A `[rows, cols]` tensor of fixed values (`shift` varies them).
    let filled = |rows: usize, cols: usize, shift: usize| {
        let data: Vec<f32> = (0..rows * cols)
            .map(|i| ((i + shift) * 7919 % 1000) as f32 / 500.0 - 1.0)
            .collect();
        be.tensor_from(rows, cols, &data)
    };
    // Fill the cache: every sequence's first `ctx` positions.
    let (q, k) = (filled(ctx, n_head * hd, 0), filled(ctx, kv_dim, 3));
    let mut out = be.tensor(ctx, n_head * hd);
    for layer in 0..n_layer {
        for t in &tables {
            let seq = [KvSeq {
                blocks: t,
                row: 0,
                n_rows: ctx,
                pos: 0,
            }];
            be.attention(&q, &k, &k, &mut pool, layer, &seq, &cfg, &mut out)
                .expect("fill");
        }
    }
    let (q, k) = (filled(seqs, n_head * hd, 0), filled(seqs, kv_dim, 5));
    let mut out = be.tensor(seqs, n_head * hd);
    let step: Vec<KvSeq> = tables
        .iter()
        .enumerate()
        .map(|(s, t)| KvSeq {
            blocks: t,
            row: s,
            n_rows: 1,
            pos: ctx,
        })
        .collect();
    let mut sweep = vec![1u8; 256 << 20];
    for cold in [false, true] {
        let mut times = Vec::new();
        for rep in 0..reps {
            let mut total = 0.0;
            for layer in 0..n_layer {
                if cold {
                    // What the weights do between two layers' attention.
                    for c in sweep.chunks_mut(4096).skip(rep % 7).step_by(7) {
                        c[0] = c[0].wrapping_add(1);
                    }
                }
                let t = Instant::now();
                be.run(|| be.attention(&q, &k, &k, &mut pool, layer, &step, &cfg, &mut out))
                    .expect("step");
                total += t.elapsed().as_secs_f64();
            }
            times.push(total);
        }
        times.sort_by(f64::total_cmp);
        let keys = (seqs * n_layer * n_head * (ctx + 1)) as f64;
        println!(
            "{seqs} seqs x {ctx} ctx, blocks of {bs}, {}: {:.3} ms per step (best of {reps}), {:.2} ns per (head, key)",
            if cold { "cold" } else { "warm" },
            times[0] * 1e3,
            times[0] * 1e9 / keys
        );
    }
    std::hint::black_box(&sweep);
}
