//! The region plan and the layout identity of a GGUF file: what the owner
//! publishes and what a worker recomputes from its own `-m` file, written
//! once so that both sides compute them the same way.

use ds4_model::gguf::GgufFile;

use super::rank::{Part, Rank};
use super::{Item, Plan, TensorDesc};

/// Plan the file's tensors, in file order, into regions
/// ([`super::plan`]).
pub fn plan(file: &GgufFile, granularity: u64, max_region: u64) -> Plan {
    plan_rank(file, Rank::WHOLE, granularity, max_region)
}

/// What `rank` holds of each tensor of the file, in file order.
pub fn parts(file: &GgufFile, rank: Rank) -> Vec<Part> {
    file.tensors()
        .iter()
        .map(|t| rank.part(&t.name, &t.shape, t.n_bytes))
        .collect()
}

/// Tensor bytes `rank` holds of the file.
pub fn held_bytes(file: &GgufFile, rank: Rank) -> u64 {
    parts(file, rank).iter().map(Part::len).sum()
}

/// Plan what `rank` holds of the file's tensors ([`Rank::part`]), in file
/// order, into regions.
pub fn plan_rank(file: &GgufFile, rank: Rank, granularity: u64, max_region: u64) -> Plan {
    let parts = parts(file, rank);
    let items: Vec<Item<'_>> = file
        .tensors()
        .iter()
        .zip(&parts)
        .map(|(t, p)| Item {
            name: &t.name,
            bytes: p.len(),
        })
        .collect();
    super::plan(&items, granularity, max_region)
}

/// The layout identity of a file (headers and sizes only;
/// [`super::layout_identity`]).
pub fn layout_identity(file: &GgufFile) -> String {
    super::layout_identity(
        file.shards()
            .iter()
            .map(|s| (s.header_bytes(), s.bytes().len() as u64)),
        file.tensors().iter().map(|t| TensorDesc {
            name: &t.name,
            ggml_type: t.ggml_type.id(),
            shape: &t.shape,
            bytes: t.n_bytes,
        }),
    )
}

#[cfg(test)]
mod tests {
    use ds4_kernels::quant::GgmlType;
    use ds4_model::gguf::writer::{write_gguf, TensorToWrite};
    use ds4_model::gguf::MetaValue;

    use super::*;

    fn file(dir: &std::path::Path, name: &str, rows: u64) -> GgufFile {
        let meta = [("general.name".to_string(), MetaValue::String("t".into()))];
        let tensors = [
            TensorToWrite {
                name: "a".into(),
                shape: vec![8, rows],
                ggml_type: GgmlType::F32,
                data: vec![1; 32 * rows as usize],
            },
            TensorToWrite {
                name: "b".into(),
                shape: vec![3],
                ggml_type: GgmlType::F32,
                data: vec![2; 12],
            },
        ];
        let path = dir.join(name);
        std::fs::write(&path, write_gguf(&meta, &tensors, 32)).unwrap();
        GgufFile::open(&path).unwrap()
    }

    #[test]
    fn plan_and_identity_follow_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path(), "a.gguf", 2);
        let p = plan(
            &f,
            super::super::HOST_GRANULARITY,
            super::super::MAX_REGION_BYTES,
        );
        assert_eq!(p.region_bytes, vec![4096]);
        assert_eq!(p.placements[1].offset, 256);
        let id = layout_identity(&f);
        assert_eq!(id, layout_identity(&file(dir.path(), "b.gguf", 2)));
        assert_ne!(id, layout_identity(&file(dir.path(), "c.gguf", 3)));
    }
}
