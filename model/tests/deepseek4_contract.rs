//! The deepseek4 family contract: the miniature model loads; copies of it
//! with one key or tensor changed are refused with an error naming it; the
//! contract describes the published Flash file (1,328 tensors).

use ds4_kernels::quant::GgmlType;
use ds4_kernels::CpuBackend;
use ds4_model::families::deepseek4::Ds4HParams;
use ds4_model::gguf::writer::{write_gguf, TensorToWrite};
use ds4_model::gguf::{GgufFile, MetaValue};
use ds4_model::{Model, ModelError};

type Meta = Vec<(String, MetaValue)>;

fn tiny() -> GgufFile {
    GgufFile::open(&ds4_tests::deepseek4::tiny_dir().join("ds4-tiny.gguf")).unwrap()
}

/// Load a rewritten copy of the miniature model.
fn load_edited(edit: impl FnOnce(&mut Meta, &mut Vec<TensorToWrite>)) -> Result<(), ModelError> {
    let f = tiny();
    let mut meta: Meta = f
        .metadata()
        .iter()
        .filter(|(k, _)| *k != "general.alignment")
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let mut tensors: Vec<TensorToWrite> = f
        .tensors()
        .iter()
        .map(|t| TensorToWrite {
            name: t.name.clone(),
            shape: t.shape.clone(),
            ggml_type: t.ggml_type,
            data: f.tensor_data(t).to_vec(),
        })
        .collect();
    edit(&mut meta, &mut tensors);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edited.gguf");
    std::fs::write(&path, write_gguf(&meta, &tensors, 32)).unwrap();
    let file = GgufFile::open(&path)?;
    Model::load(&file, &CpuBackend::new()).map(|_| ())
}

fn set(meta: &mut Meta, key: &str, v: MetaValue) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

#[test]
fn the_miniature_model_loads() {
    load_edited(|_, _| {}).unwrap();
    let f = tiny();
    let m = Model::load(&f, &CpuBackend::new()).unwrap();
    assert_eq!(m.info().n_layer, 5);
    assert_eq!(m.info().n_vocab, 512);
}

#[test]
fn fixed_architecture_values_are_enforced() {
    let e = load_edited(|m, _| set(m, "deepseek4.hyper_connection.count", MetaValue::U32(3)))
        .unwrap_err();
    assert!(e.to_string().contains("hyper_connection.count"), "{e}");
    let e = load_edited(|m, _| {
        let mut r = vec![MetaValue::I32(0); 6];
        r[2] = MetaValue::I32(8);
        set(
            m,
            "deepseek4.attention.compress_ratios",
            MetaValue::Array(r),
        );
    })
    .unwrap_err();
    assert!(e.to_string().contains("0, 4 or 128"), "{e}");
    let e =
        load_edited(|m, _| set(m, "deepseek4.expert_gating_func", MetaValue::U32(1))).unwrap_err();
    assert!(e.to_string().contains("sqrt-softplus"), "{e}");
    let e = load_edited(|m, _| {
        set(
            m,
            "deepseek4.rope.scaling.type",
            MetaValue::String("linear".into()),
        )
    })
    .unwrap_err();
    assert!(e.to_string().contains("yarn"), "{e}");
}

#[test]
fn keys_llamacpp_requires_are_required() {
    for key in [
        "deepseek4.context_length",
        "deepseek4.expert_gating_func",
        "deepseek4.rope.scaling.type",
    ] {
        let e = load_edited(|m, _| m.retain(|(k, _)| k != key)).unwrap_err();
        assert!(
            matches!(&e, ModelError::MissingKey { key: k, .. } if k == key),
            "{e}"
        );
    }
}

#[test]
fn tensor_inventory_is_checked() {
    let e = load_edited(|_, t| t.retain(|t| t.name != "blk.2.indexer.proj.weight")).unwrap_err();
    assert!(
        matches!(&e, ModelError::MissingTensor { name, .. } if name == "blk.2.indexer.proj.weight"),
        "{e}"
    );
    // A ratio-128 layer has no indexer.
    let e = load_edited(|_, t| {
        let mut extra = t
            .iter()
            .find(|t| t.name == "blk.2.indexer.proj.weight")
            .unwrap()
            .clone();
        extra.name = "blk.3.indexer.proj.weight".into();
        t.push(extra);
    })
    .unwrap_err();
    assert!(matches!(e, ModelError::UnexpectedTensor { .. }), "{e}");
    let e = load_edited(|_, t| {
        let tid = t
            .iter_mut()
            .find(|t| t.name == "blk.0.ffn_gate_tid2eid.weight")
            .unwrap();
        tid.ggml_type = GgmlType::F32;
    })
    .unwrap_err();
    assert!(e.to_string().contains("I32"), "{e}");
    let e = load_edited(|_, t| {
        let w = t
            .iter_mut()
            .find(|t| t.name == "blk.3.attn_compressor_ape.weight")
            .unwrap();
        w.shape = vec![256, 4];
        w.data.truncate(256 * 4 * 2);
    })
    .unwrap_err();
    assert!(matches!(e, ModelError::TensorShape { .. }), "{e}");
}

/// The published Flash layout: every value of the spec's table, and the
/// tensor count of §2.7.
#[test]
fn flash_layout_has_1328_tensors() {
    let mut h = Ds4HParams::from_file(&tiny()).unwrap();
    h.n_layer = 43;
    h.n_embd = 4096;
    h.n_vocab = 129280;
    h.n_head = 64;
    h.head_dim = 512;
    h.q_lora = 1024;
    h.o_lora = 1024;
    h.o_groups = 8;
    h.n_expert = 256;
    h.n_expert_used = 6;
    h.n_ff = 2048;
    h.idx_heads = 64;
    h.idx_top_k = 512;
    h.ratios = (0..43)
        .map(ds4_model::families::deepseek4::hparams::flash_ratio)
        .collect();
    h.clamp = vec![10.0; 43];
    h.clamp_shared = vec![10.0; 43];
    h.check_flash().unwrap();
    let t = h.expected_tensors();
    assert_eq!(t.len(), 1328);
    let params: u64 = t.iter().map(|t| t.shape.iter().product::<u64>()).sum();
    // 284.33 B parameters (spec §2.7), counting the I32 table entries.
    assert_eq!(params / 10_000_000, 28433);
    h.idx_top_k = 1024;
    assert!(h.check_flash().is_err());
}
