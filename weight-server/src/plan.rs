//! From a GGUF and its region plan to the manifest's tensor and shard
//! entries, and the dry-run's byte breakdown. The plan and the layout
//! identity themselves are `ds4_proto::layout::gguf`, shared with workers.

use std::collections::BTreeMap;
use std::time::UNIX_EPOCH;

use ds4_model::gguf::GgufFile;
use ds4_proto::layout::Plan;
use ds4_proto::manifest::{ShardEntry, TensorEntry, LAYOUT_GGUF};

/// The manifest's tensor list for a plan of `file`.
pub fn tensor_entries(file: &GgufFile, plan: &Plan) -> Vec<TensorEntry> {
    file.tensors()
        .iter()
        .zip(&plan.placements)
        .map(|(t, p)| TensorEntry {
            name: t.name.clone(),
            region: p.region,
            offset: p.offset,
            bytes: t.n_bytes,
            ggml_type: t.ggml_type.id(),
            shape: t.shape.clone(),
            layout: LAYOUT_GGUF.into(),
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

/// Tensor bytes by class.
pub fn bytes_by_class(file: &GgufFile) -> BTreeMap<&'static str, u64> {
    let mut m = BTreeMap::new();
    for t in file.tensors() {
        *m.entry(tensor_class(&t.name)).or_insert(0) += t.n_bytes;
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
