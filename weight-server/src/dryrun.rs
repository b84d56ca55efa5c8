//! The preflight: validate, plan, compare with the memory the backend
//! sees. Allocates nothing and writes nothing.

use std::fmt::Write;

use ds4_model::gguf::GgufFile;
use ds4_proto::layout::rank::{is_routed_experts, Rank};
use ds4_proto::layout::{self, Plan};

use crate::backend::MemoryView;
use crate::plan;

/// Exit codes of `--dry-run`.
pub const FITS: i32 = 0;
pub const DOES_NOT_FIT: i32 = 1;
pub const UNSUPPORTED: i32 = 2;

const GIB: f64 = (1u64 << 30) as f64;

/// The report and whether the plan fits: `need + reserve <= available`.
#[allow(clippy::too_many_arguments)]
pub fn report(
    file: &GgufFile,
    family: &str,
    rank: Rank,
    backend: &str,
    plan: &Plan,
    memory: &MemoryView,
    reserve_bytes: u64,
) -> (String, bool) {
    let mut s = String::new();
    let total = plan.total_bytes();
    let _ = writeln!(
        s,
        "model      {} (family {family}, {} shard(s), {} tensors)",
        file.shards()[0].path.display(),
        file.shards().len(),
        file.tensors().len()
    );
    if !rank.is_whole() {
        let routed: Vec<_> = file
            .tensors()
            .iter()
            .filter(|t| is_routed_experts(&t.name))
            .collect();
        let experts = routed
            .first()
            .and_then(|t| t.shape.last().copied())
            .unwrap_or(0);
        let all: u64 = routed.iter().map(|t| t.n_bytes).sum();
        let held: u64 = routed
            .iter()
            .map(|t| rank.part(&t.name, &t.shape, t.n_bytes).len())
            .sum();
        let e = rank.experts(experts);
        let _ = writeln!(
            s,
            "rank       {rank}: routed experts {}..{} of {experts} ({held} of {all} routed expert bytes), every other tensor whole",
            e.start, e.end
        );
    }
    let _ = writeln!(s, "backend    {backend}");
    let _ = writeln!(
        s,
        "regions    {} (largest {:.3} GiB)",
        plan.region_bytes.len(),
        plan.region_bytes.iter().copied().max().unwrap_or(0) as f64 / GIB
    );
    let _ = writeln!(s, "tensor bytes by class:");
    for (class, bytes) in plan::bytes_by_class(file, rank) {
        let _ = writeln!(s, "  {class:<20} {:>10.3} GiB", bytes as f64 / GIB);
    }
    let _ = writeln!(
        s,
        "total      {:.3} GiB in regions ({:.3} GiB of tensor data)",
        total as f64 / GIB,
        layout::gguf::held_bytes(file, rank) as f64 / GIB
    );
    let _ = writeln!(s, "reserve    {:.3} GiB", reserve_bytes as f64 / GIB);
    let _ = writeln!(
        s,
        "memory     {:.3} GiB {} of {:.3} GiB",
        memory.available as f64 / GIB,
        memory.what,
        memory.total as f64 / GIB
    );
    let need = total.saturating_add(reserve_bytes);
    let fits = need <= memory.available;
    let _ = writeln!(
        s,
        "verdict    {} (need {:.3} GiB with the reserve, {:.3} GiB available)",
        if fits { "FITS" } else { "DOES NOT FIT" },
        need as f64 / GIB,
        memory.available as f64 / GIB
    );
    (s, fits)
}

/// The report of a synthetic fill (no model).
pub fn report_synthetic(
    backend: &str,
    plan: &Plan,
    memory: &MemoryView,
    reserve_bytes: u64,
) -> (String, bool) {
    let total = plan.total_bytes();
    let need = total.saturating_add(reserve_bytes);
    let fits = need <= memory.available;
    let s = format!(
        "model      (synthetic pattern)\nbackend    {backend}\nregions    {} (largest {:.3} GiB)\ntotal      {:.3} GiB\nreserve    {:.3} GiB\nmemory     {:.3} GiB {} of {:.3} GiB\nverdict    {}\n",
        plan.region_bytes.len(),
        plan.region_bytes.iter().copied().max().unwrap_or(0) as f64 / GIB,
        total as f64 / GIB,
        reserve_bytes as f64 / GIB,
        memory.available as f64 / GIB,
        memory.what,
        memory.total as f64 / GIB,
        if fits { "FITS" } else { "DOES NOT FIT" }
    );
    (s, fits)
}
