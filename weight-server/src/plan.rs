//! From a GGUF and its region plan to the manifest's tensor and shard
//! entries, and the dry-run's byte breakdown. The plan and the layout
//! identity themselves are `ds4_proto::layout::gguf`, shared with workers.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use ds4_model::gguf::GgufFile;
use ds4_proto::layout::{self, rank::Rank, Plan};
use ds4_proto::manifest::{ShardEntry, TensorEntry, LAYOUT_GGUF, LAYOUT_GGUF_EXPERTS};

/// The manifest's tensor list for `rank`'s plan of `file`: whole tensors
/// as `gguf`, a rank's range of a routed expert tensor as `gguf-experts`
/// (its shape counting only those experts).
pub fn tensor_entries(file: &GgufFile, rank: Rank, plan: &Plan) -> Vec<TensorEntry> {
    let parts = layout::gguf::parts(file, rank);
    file.tensors()
        .iter()
        .zip(&plan.placements)
        .zip(parts)
        .map(|((t, p), part)| {
            let mut shape = t.shape.clone();
            let layout = match &part.experts {
                Some(e) => {
                    if let Some(last) = shape.last_mut() {
                        *last = e.end - e.start;
                    }
                    LAYOUT_GGUF_EXPERTS
                }
                None => LAYOUT_GGUF,
            };
            TensorEntry {
                name: t.name.clone(),
                region: p.region,
                offset: p.offset,
                bytes: part.len(),
                ggml_type: t.ggml_type.id(),
                shape,
                layout: layout.into(),
                experts: part.experts.map(|e| [e.start, e.end]),
            }
        })
        .collect()
}

/// Path, size and mtime of every shard.
pub fn shard_entries(file: &GgufFile) -> Vec<ShardEntry> {
    file.shards()
        .iter()
        .map(|s| {
            let path = std::fs::canonicalize(&s.path).unwrap_or_else(|_| s.path.clone());
            let mtime = std::fs::metadata(&s.path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs());
            ShardEntry {
                path,
                bytes: s.bytes().len() as u64,
                mtime,
            }
        })
        .collect()
}

/// The class of a tensor for the dry-run's byte breakdown.
pub fn tensor_class(name: &str) -> &'static str {
    let base = name.strip_suffix(".weight").unwrap_or(name);
    let leaf = base.rsplit('.').next().unwrap_or(base);
    if base == "token_embd" {
        "embedding"
    } else if base == "output" {
        "output"
    } else if leaf.ends_with("norm") || leaf.contains("norm") {
        "norm"
    } else if leaf.contains("exp") || leaf.contains("gate_inp") {
        "moe experts/router"
    } else if leaf.starts_with("ffn") {
        "ffn"
    } else if leaf.starts_with("attn") {
        "attention"
    } else {
        "other"
    }
}

/// Tensor bytes `rank` holds, by class.
pub fn bytes_by_class(file: &GgufFile, rank: Rank) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    for (t, p) in file.tensors().iter().zip(layout::gguf::parts(file, rank)) {
        *m.entry(tensor_class(&t.name)).or_insert(0) += p.len();
    }
    m
}

#[cfg(test)]
mod tests {
    use super::tensor_class;

    #[test]
    fn classes() {
        assert_eq!(tensor_class("token_embd.weight"), "embedding");
        assert_eq!(tensor_class("output.weight"), "output");
        assert_eq!(tensor_class("output_norm.weight"), "norm");
        assert_eq!(tensor_class("blk.3.attn_q.weight"), "attention");
        assert_eq!(tensor_class("blk.3.ffn_down.weight"), "ffn");
        assert_eq!(
            tensor_class("blk.3.ffn_down_exps.weight"),
            "moe experts/router"
        );
        assert_eq!(tensor_class("blk.3.attn_norm.weight"), "norm");
    }
}
