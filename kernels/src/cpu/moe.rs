//! CPU reference of routed mixtures of experts (DeepSeek V4, spec §3.7)
//! and of grouped projections: sqrt-softplus routing (hash-routed or
//! biased top-k), the routed experts with the clamped SwiGLU (the route
//! weight applied before the down projection), and a weight applied per
//! column group. Each expert (and group) runs the backend's own matmul on
//! a row block of the weight, so its numerics are the matmul's.

use super::hyper::clamped_swiglu_value;
use super::{CpuTensor, CpuWeight};
use crate::backend::{BackendError, RouteConfig};
use crate::quant::GgmlType;

type Matmul<'a> = &'a dyn Fn(&CpuWeight, &CpuTensor, &mut CpuTensor) -> Result<(), BackendError>;

fn shape_err(op: &'static str, detail: String) -> BackendError {
    BackendError::Shape { op, detail }
}

/// ds4's softplus: `x` above 20, `eˣ` below −20.
fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else if x < -20.0 {
        x.exp()
    } else {
        x.exp().ln_1p()
    }
}

/// Expert ids and route weights for one row.
fn route_row(
    logits: &[f32],
    bias: Option<&[f32]>,
    hashed: Option<&[i32]>,
    cfg: &RouteConfig,
) -> Vec<(usize, f32)> {
    let pi: Vec<f64> = logits
        .iter()
        .map(|&l| softplus(f64::from(l)).sqrt())
        .collect();
    let chosen: Vec<usize> = match hashed {
        Some(ids) => ids.iter().map(|&e| e as usize).collect(),
        None => {
            let sc: Vec<f64> = match bias {
                Some(b) => pi.iter().zip(b).map(|(p, b)| p + f64::from(*b)).collect(),
                None => pi.clone(),
            };
            let mut order: Vec<usize> = (0..pi.len()).collect();
            order.sort_by(|&a, &b| sc[b].total_cmp(&sc[a]).then(a.cmp(&b)));
            order.truncate(cfg.k);
            order
        }
    };
    let sum: f64 = chosen.iter().map(|&e| pi[e]).sum();
    let den = sum.max(6.103515625e-5);
    chosen
        .into_iter()
        .map(|e| (e, (f64::from(cfg.scale) * pi[e] / den) as f32))
        .collect()
}

/// The i32 values of a hash table weight.
fn hash_ids(table: &CpuWeight) -> Result<Vec<i32>, BackendError> {
    if table.ggml_type != GgmlType::I32 {
        return Err(shape_err(
            "moe_route",
            format!(
                "hash table {} is {}, expected i32",
                table.name, table.ggml_type
            ),
        ));
    }
    Ok(table
        .bytes_all()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[allow(clippy::too_many_arguments)]
pub fn moe_route(
    logits: &CpuTensor,
    bias: Option<&CpuWeight>,
    hash: Option<(&CpuWeight, &[u32])>,
    cfg: &RouteConfig,
    ids: &mut CpuTensor,
    weights: &mut CpuTensor,
) -> Result<(), BackendError> {
    let n_expert = logits.cols;
    if ids.cols != cfg.k
        || weights.cols != cfg.k
        || ids.rows != logits.rows
        || weights.rows != logits.rows
    {
        return Err(shape_err(
            "moe_route",
            format!(
                "{} rows of {n_expert} logits into ids [{}, {}] and weights [{}, {}], k = {}",
                logits.rows, ids.rows, ids.cols, weights.rows, weights.cols, cfg.k
            ),
        ));
    }
    let bias = bias.map(|b| b.dense());
    let hash = match hash {
        Some((table, tokens)) => {
            if tokens.len() != logits.rows || table.cols != cfg.k {
                return Err(shape_err(
                    "moe_route",
                    format!(
                        "{} tokens for {} rows, hash rows of {} for k = {}",
                        tokens.len(),
                        logits.rows,
                        table.cols,
                        cfg.k
                    ),
                ));
            }
            let ids = hash_ids(table)?;
            if let Some(bad) = ids.iter().find(|&&e| e < 0 || e as usize >= n_expert) {
                return Err(shape_err(
                    "moe_route",
                    format!("hash table names expert {bad} of {n_expert}"),
                ));
            }
            if let Some(&t) = tokens.iter().find(|&&t| t as usize >= table.rows) {
                return Err(shape_err(
                    "moe_route",
                    format!("token {t} is outside the hash table of {} rows", table.rows),
                ));
            }
            Some((ids, tokens))
        }
        None => None,
    };
    for r in 0..logits.rows {
        let hashed = hash.as_ref().map(|(ids, tokens)| {
            &ids[tokens[r] as usize * cfg.k..(tokens[r] as usize + 1) * cfg.k]
        });
        let chosen = route_row(logits.row(r), bias, hashed, cfg);
        for (i, (e, w)) in chosen.into_iter().enumerate() {
            ids.data[r * cfg.k + i] = e as f32;
            weights.data[r * cfg.k + i] = w;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    gate: &CpuWeight,
    up: &CpuWeight,
    down: &CpuWeight,
    n_expert: usize,
    x: &CpuTensor,
    ids: &CpuTensor,
    weights: &CpuTensor,
    clamp: f32,
    out: &mut CpuTensor,
    matmul: Matmul<'_>,
) -> Result<(), BackendError> {
    let d = x.cols;
    let n_ff = gate.rows / n_expert.max(1);
    if n_expert == 0
        || gate.rows != n_expert * n_ff
        || up.rows != gate.rows
        || gate.cols != d
        || up.cols != d
        || down.rows != n_expert * d
        || down.cols != n_ff
        || ids.rows != x.rows
        || weights.rows != x.rows
        || ids.cols != weights.cols
        || out.rows != x.rows
        || out.cols != d
    {
        return Err(shape_err(
            "moe_experts",
            format!(
                "{n_expert} experts: gate [{}, {}], up [{}, {}], down [{}, {}], x [{}, {d}], ids [{}, {}], out [{}, {}]",
                gate.rows, gate.cols, up.rows, up.cols, down.rows, down.cols, x.rows, ids.rows, ids.cols, out.rows, out.cols
            ),
        ));
    }
    // (row, weight) pairs per expert, in row order.
    let mut per_expert: Vec<Vec<(usize, f32)>> = vec![Vec::new(); n_expert];
    for r in 0..x.rows {
        for (&e, &w) in ids.row(r).iter().zip(weights.row(r)) {
            let e = e as usize;
            if e >= n_expert {
                return Err(shape_err(
                    "moe_experts",
                    format!("expert {e} of {n_expert}"),
                ));
            }
            per_expert[e].push((r, w));
        }
    }
    out.data.fill(0.0);
    for (e, list) in per_expert.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let n = list.len();
        let mut fx = CpuTensor {
            rows: n,
            cols: d,
            data: Vec::with_capacity(n * d),
        };
        for &(r, _) in list {
            fx.data.extend_from_slice(x.row(r));
        }
        let mut g = CpuTensor {
            rows: n,
            cols: n_ff,
            data: vec![0.0; n * n_ff],
        };
        let mut u = g.clone();
        matmul(&gate.rows_view(e * n_ff, n_ff), &fx, &mut g)?;
        matmul(&up.rows_view(e * n_ff, n_ff), &fx, &mut u)?;
        for (i, &(_, w)) in list.iter().enumerate() {
            for (gv, &uv) in g.data[i * n_ff..(i + 1) * n_ff]
                .iter_mut()
                .zip(&u.data[i * n_ff..(i + 1) * n_ff])
            {
                *gv = clamped_swiglu_value(*gv, uv, clamp, w);
            }
        }
        let mut y = CpuTensor {
            rows: n,
            cols: d,
            data: vec![0.0; n * d],
        };
        matmul(&down.rows_view(e * d, d), &g, &mut y)?;
        for (i, &(r, _)) in list.iter().enumerate() {
            out.data[r * d..(r + 1) * d]
                .iter_mut()
                .zip(y.row(i))
                .for_each(|(a, b)| *a += b);
        }
    }
    Ok(())
}

pub fn matmul_grouped(
    w: &CpuWeight,
    x: &CpuTensor,
    groups: usize,
    out: &mut CpuTensor,
    matmul: Matmul<'_>,
) -> Result<(), BackendError> {
    if groups == 0
        || !w.rows.is_multiple_of(groups)
        || x.cols != groups * w.cols
        || out.cols != w.rows
        || out.rows != x.rows
    {
        return Err(shape_err(
            "matmul_grouped",
            format!(
                "{} is [{}, {}] in {groups} groups, x is [{}, {}], out is [{}, {}]",
                w.name, w.rows, w.cols, x.rows, x.cols, out.rows, out.cols
            ),
        ));
    }
    let (m, n) = (w.rows / groups, w.cols);
    for g in 0..groups {
        let mut xg = CpuTensor {
            rows: x.rows,
            cols: n,
            data: Vec::with_capacity(x.rows * n),
        };
        for r in 0..x.rows {
            xg.data.extend_from_slice(&x.row(r)[g * n..(g + 1) * n]);
        }
        let mut ug = CpuTensor {
            rows: x.rows,
            cols: m,
            data: vec![0.0; x.rows * m],
        };
        matmul(&w.rows_view(g * m, m), &xg, &mut ug)?;
        for r in 0..x.rows {
            out.data[r * out.cols + g * m..r * out.cols + (g + 1) * m].copy_from_slice(ug.row(r));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn biased_selection_unbiased_weights() {
        let cfg = RouteConfig { k: 2, scale: 1.5 };
        let r = route_row(
            &[0.0, 1.0, 2.0, -1.0],
            Some(&[0.0, 0.0, 0.0, 10.0]),
            None,
            &cfg,
        );
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![3, 2]);
        let total: f32 = r.iter().map(|x| x.1).sum();
        assert!((total - 1.5).abs() < 1e-6);
        let h = route_row(
            &[0.0, 1.0, 2.0, -1.0],
            None,
            Some(&[1, 0]),
            &RouteConfig { k: 2, scale: 1.0 },
        );
        assert_eq!(h[0].0, 1);
    }
}
