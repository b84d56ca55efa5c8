//! The GGUF reader against files built here (writer round trips and
//! hand-assembled bytes for what the writer cannot produce), split models,
//! and the default model. Malformed input is covered in `gguf_fuzz.rs`.

mod common;
mod gguf_support;

use std::path::Path;

use ds4_kernels::quant::GgmlType;
use ds4_model::gguf::writer::{write_gguf, TensorToWrite};
use ds4_model::gguf::{parse_header, GgufError, GgufFile, MetaValue};
use gguf_support::{
    inner, raw_tensor, tensor, tensor_size, typed, typed_str, typed_u32, vt, write_file, RawGguf,
};

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "t.gguf", bytes);
    GgufFile::open(&path)
}

fn all_value_types() -> Vec<(String, MetaValue)> {
    use MetaValue as V;
    let arr = |v: Vec<MetaValue>| V::Array(v);
    let kv = [
        ("general.architecture", V::String("llama".into())),
        ("t.u8", V::U8(200)),
        ("t.i8", V::I8(-5)),
        ("t.u16", V::U16(60_000)),
        ("t.i16", V::I16(-30_000)),
        ("t.u32", V::U32(4_000_000_000)),
        ("t.i32", V::I32(-2_000_000_000)),
        ("t.u64", V::U64(u64::MAX)),
        ("t.i64", V::I64(i64::MIN)),
        ("t.f32", V::F32(1.5)),
        ("t.f64", V::F64(-2.25e300)),
        ("t.bool_true", V::Bool(true)),
        ("t.bool_false", V::Bool(false)),
        ("t.string", V::String("h\u{e9}llo \u{1f980}".into())),
        ("t.empty_string", V::String(String::new())),
        ("t.arr.u8", arr(vec![V::U8(0), V::U8(255)])),
        ("t.arr.i8", arr(vec![V::I8(-128), V::I8(127)])),
        ("t.arr.u16", arr(vec![V::U16(1), V::U16(65_535)])),
        ("t.arr.i16", arr(vec![V::I16(-1), V::I16(2)])),
        ("t.arr.u32", arr(vec![V::U32(3), V::U32(4)])),
        ("t.arr.i32", arr(vec![V::I32(-3), V::I32(4), V::I32(5)])),
        ("t.arr.u64", arr(vec![V::U64(1 << 40)])),
        ("t.arr.i64", arr(vec![V::I64(-(1 << 40)), V::I64(7)])),
        ("t.arr.f32", arr(vec![V::F32(0.25), V::F32(-8.0)])),
        ("t.arr.f64", arr(vec![V::F64(1e-300)])),
        (
            "t.arr.bool",
            arr(vec![V::Bool(true), V::Bool(false), V::Bool(true)]),
        ),
        (
            "t.arr.string",
            arr(vec![
                V::String("a".into()),
                V::String(String::new()),
                V::String("<s>".into()),
            ]),
        ),
        ("t.arr.empty", arr(vec![])),
        (
            "t.arr.arr",
            arr(vec![
                arr(vec![V::I32(1), V::I32(2)]),
                arr(vec![V::I32(3)]),
                arr(vec![]),
            ]),
        ),
        (
            "t.arr.arr.arr",
            arr(vec![
                arr(vec![arr(vec![V::String("deep".into())])]),
                arr(vec![arr(vec![])]),
            ]),
        ),
        ("llama.block_count", V::U32(2)),
    ];
    kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn mixed_tensors() -> Vec<TensorToWrite> {
    vec![
        tensor("a.f32", &[8, 3], GgmlType::F32),
        tensor("b.f16", &[16], GgmlType::F16),
        tensor("c.q8_0", &[64, 2], GgmlType::Q8_0),
        tensor("d.q4_1", &[32], GgmlType::Q4_1),
        tensor("e.q4_k", &[256, 2], GgmlType::Q4_K),
        tensor("f.bf16", &[3, 1, 2, 1], GgmlType::BF16),
    ]
}

#[test]
fn round_trip_every_value_type_and_tensor_type() {
    let meta = all_value_types();
    let tensors = mixed_tensors();
    let bytes = write_gguf(&meta, &tensors, 64);
    let f = open_bytes(&bytes).expect("written file opens");

    let mut want = meta.clone();
    want.push(("general.alignment".into(), MetaValue::U32(64)));
    let got: Vec<(String, MetaValue)> = f
        .metadata()
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    assert_eq!(got, want, "metadata read back in file order");
    assert_eq!(f.metadata().len(), want.len());
    for (k, v) in &want {
        assert_eq!(f.metadata().get(k), Some(v), "lookup of {k}");
    }

    let shard = &f.shards()[0];
    assert_eq!((shard.version, shard.alignment), (3, 64));
    assert_eq!(shard.data_offset % 64, 0);
    assert_eq!(shard.header_bytes().len() as u64, shard.data_offset);
    assert_eq!(f.tensors().len(), tensors.len());
    for (t, w) in f.tensors().iter().zip(&tensors) {
        assert_eq!(t.name, w.name);
        assert_eq!(t.shape, w.shape);
        assert_eq!(t.ggml_type, w.ggml_type);
        assert_eq!(t.shard, 0);
        assert_eq!(t.n_bytes as usize, w.data.len(), "{}", t.name);
        assert_eq!(t.n_bytes as usize, tensor_size(w.ggml_type, &w.shape));
        assert_eq!(t.n_elements(), w.shape.iter().product::<u64>());
        assert_eq!(t.file_offset % 64, 0, "{} aligned in the file", t.name);
        assert_eq!(f.tensor_data(t), &w.data[..], "bytes of {}", t.name);
        assert_eq!(
            f.tensor(&w.name).map(|x| x.file_offset),
            Some(t.file_offset)
        );
    }
    assert!(f.tensor("missing").is_none());
    assert_eq!(
        f.tensor_bytes(),
        tensors.iter().map(|t| t.data.len() as u64).sum::<u64>()
    );
    assert_eq!(f.architecture(), Some("llama"));
    // The same header through the slice parser.
    let h = parse_header(&bytes).unwrap();
    assert_eq!((h.alignment, h.data_offset), (64, shard.data_offset));
}

#[test]
fn metadata_getters_convert_and_name_the_key() {
    let bytes = write_gguf(&all_value_types(), &[], 32);
    let m = parse_header(&bytes).unwrap().metadata;
    assert_eq!(m.get_u64("t.u8"), Some(200));
    assert_eq!(m.get_u64("t.i8"), None, "negative is not a u64");
    assert_eq!(m.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(m.get_f64("t.f32"), Some(1.5));
    assert_eq!(m.get_f64("t.i16"), Some(-30_000.0));
    assert_eq!(m.get_bool("t.bool_true"), Some(true));
    assert_eq!(m.get_str("t.string"), Some("h\u{e9}llo \u{1f980}"));
    assert_eq!(m.get_array("t.arr.string").map(<[_]>::len), Some(3));
    assert_eq!(m.require_u64("llama.block_count").unwrap(), 2);
    let e = m.require_u64("t.string").unwrap_err();
    assert!(matches!(e, GgufError::WrongKeyType { .. }), "{e:?}");
    assert!(e.to_string().contains("t.string"), "{e}");
    let e = m.require_str("no.such.key").unwrap_err();
    assert!(
        e.to_string().contains("no.such.key") && e.to_string().contains("missing"),
        "{e}"
    );
    assert!(m.require_f64("t.arr.f32").is_err());
}

#[test]
fn version_2_opens_and_other_versions_are_refused() {
    let raw = RawGguf {
        version: 2,
        data: vec![1; 16],
        ..Default::default()
    }
    .kv("general.architecture", typed_str("llama"))
    .tensor(raw_tensor("w", &[4], GgmlType::F32.id(), 0));
    let f = open_bytes(&raw.build()).expect("v2 opens");
    assert_eq!(f.shards()[0].version, 2);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.tensor_data(&f.tensors()[0]), &[1u8; 16][..]);

    for (version, needle) in [
        (1u32, "llama.cpp"),
        (2u32 << 24, "big-endian"),
        (3u32 << 24, "big-endian"),
        (4, ""),
        (0, ""),
    ] {
        let bytes = RawGguf {
            version,
            ..raw.clone()
        }
        .build();
        let e = parse_header(&bytes).unwrap_err();
        assert!(
            matches!(e, GgufError::UnsupportedVersion { version: v, .. } if v == version),
            "{e:?}"
        );
        assert!(e.to_string().contains(needle), "{e}");
        let e = open_bytes(&bytes).unwrap_err();
        assert!(
            matches!(inner(&e), GgufError::UnsupportedVersion { .. }),
            "{e:?}"
        );
    }
}

#[test]
fn data_offset_when_header_ends_on_and_off_an_alignment_boundary() {
    for alignment in [32u64, 64, 1, 256] {
        // Every residue of the header length, so one case ends exactly on
        // the boundary (and must not get a whole block of padding).
        let mut on_boundary = 0;
        for extra in 0..alignment {
            let base = RawGguf {
                pad_to: alignment,
                data: (0..16).collect(),
                ..Default::default()
            }
            .kv("pad", typed_str(&"x".repeat(extra as usize)))
            .tensor(raw_tensor("w", &[4], GgmlType::F32.id(), 0));
            let base = if alignment == 32 {
                base
            } else {
                base.kv("general.alignment", typed_u32(alignment as u32))
            };
            let header_len = base.header().len() as u64;
            let want = header_len.div_ceil(alignment) * alignment;
            if header_len.is_multiple_of(alignment) {
                on_boundary += 1;
                assert_eq!(want, header_len);
            }
            let bytes = base.build();
            let h = parse_header(&bytes).unwrap();
            assert_eq!(
                h.data_offset, want,
                "alignment {alignment}, header {header_len} bytes"
            );
            let f = open_bytes(&bytes).unwrap();
            assert_eq!(
                f.tensor_data(&f.tensors()[0]),
                &(0..16).collect::<Vec<u8>>()[..]
            );
        }
        assert_eq!(on_boundary, 1, "alignment {alignment}");
    }
}

#[test]
fn header_only_file_without_padding_opens() {
    // No tensors and no padding after the header: nothing to read, so it
    // opens, and the header accessor stays inside the file.
    let raw = RawGguf::default().kv("general.architecture", typed_str("llama"));
    let header = raw.header();
    assert_ne!(header.len() % 32, 0, "the test needs an unpadded header");
    let f = open_bytes(&header).expect("header-only file opens");
    assert!(f.tensors().is_empty());
    assert_eq!(f.shards()[0].header_bytes(), &header[..]);
}

#[test]
fn empty_file_directory_and_missing_file_are_clean_errors() {
    let dir = tempfile::tempdir().unwrap();
    let empty = write_file(dir.path(), "empty.gguf", &[]);
    let e = GgufFile::open(&empty).unwrap_err();
    assert!(
        matches!(
            inner(&e),
            GgufError::Truncated { .. } | GgufError::BadMagic { .. }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("empty.gguf"), "{e}");

    let e = GgufFile::open(dir.path()).unwrap_err();
    match &e {
        GgufError::Io { path, .. } => assert_eq!(path, dir.path()),
        other => panic!("directory: expected Io, got {other:?}"),
    }
    assert!(e.to_string().contains("directory"), "{e}");

    let missing = dir.path().join("nope.gguf");
    let e = GgufFile::open(&missing).unwrap_err();
    assert!(
        matches!(&e, GgufError::Io { path, .. } if *path == missing),
        "{e:?}"
    );

    let e = GgufFile::open(&write_file(dir.path(), "text.gguf", b"hello world")).unwrap_err();
    assert!(matches!(inner(&e), GgufError::BadMagic { .. }), "{e:?}");
}

// ---- tensor and key checks: each a specific variant naming the culprit ----

/// A valid two-tensor file to break one thing at a time.
fn two_tensors() -> RawGguf {
    RawGguf {
        data: vec![0; 128],
        ..Default::default()
    }
    .kv("general.architecture", typed_str("llama"))
    .tensor(raw_tensor("blk.0.a", &[8], GgmlType::F32.id(), 0))
    .tensor(raw_tensor("blk.0.b", &[32, 2], GgmlType::Q8_0.id(), 32))
}

#[track_caller]
fn expect_err(raw: &RawGguf, what: &str, names: &[&str], check: impl Fn(&GgufError) -> bool) {
    let e = open_bytes(&raw.build()).expect_err(what);
    let msg = e.to_string();
    assert!(check(inner(&e)), "{what}: unexpected error {e:?}");
    for n in names {
        assert!(
            msg.contains(n),
            "{what}: message {msg:?} does not name {n:?}"
        );
    }
    assert!(
        msg.contains("t.gguf"),
        "{what}: message {msg:?} does not name the file"
    );
}

#[test]
fn valid_base_for_tensor_checks_opens() {
    let f = open_bytes(&two_tensors().build()).unwrap();
    assert_eq!(f.tensors().len(), 2);
    assert_eq!(f.tensors()[1].n_bytes, 68);
}

#[test]
fn tensor_placement_errors() {
    let mut r = two_tensors();
    r.tensors[1].offset = 36;
    expect_err(&r, "misaligned", &["blk.0.b", "aligned"], |e| {
        matches!(e, GgufError::BadTensor { .. })
    });

    let mut r = two_tensors();
    r.tensors[1].offset = 64;
    expect_err(&r, "past end", &["blk.0.b", "past the end"], |e| {
        matches!(e, GgufError::BadTensor { .. })
    });

    let mut r = two_tensors();
    r.tensors[1].offset = u64::MAX - 31;
    expect_err(&r, "offset near u64::MAX", &["blk.0.b"], |e| {
        matches!(e, GgufError::BadTensor { .. })
    });

    let mut r = two_tensors();
    r.tensors[0].dims = vec![16];
    expect_err(&r, "overlap", &["blk.0.a", "blk.0.b"], |e| {
        matches!(e, GgufError::Overlap { .. })
    });

    let mut r = two_tensors();
    r.tensors[1].offset = 0;
    expect_err(&r, "same offset", &["blk.0.a", "blk.0.b"], |e| {
        matches!(e, GgufError::Overlap { .. })
    });

    let mut r = two_tensors();
    r.tensors[1].name = "blk.0.a".into();
    expect_err(&r, "duplicate tensor", &["blk.0.a"], |e| {
        matches!(e, GgufError::DuplicateTensor { .. })
    });

    // Data section cut short of the last tensor.
    let mut r = two_tensors();
    r.data.truncate(99);
    expect_err(&r, "short data", &["blk.0.b"], |e| {
        matches!(e, GgufError::BadTensor { .. })
    });
}

#[test]
fn tensor_shape_and_type_errors() {
    let shape_err = |dims: &[u64], ty: GgmlType, what: &str, needle: &str| {
        let mut r = two_tensors();
        r.tensors[1].dims = dims.to_vec();
        r.tensors[1].type_id = ty.id();
        expect_err(&r, what, &["blk.0.b", needle], |e| {
            matches!(e, GgufError::BadTensor { .. })
        });
        // Shape problems are header problems: the slice parser sees them too.
        assert!(
            matches!(parse_header(&r.build()), Err(GgufError::BadTensor { .. })),
            "{what}"
        );
    };
    shape_err(&[32, 0], GgmlType::Q8_0, "zero dim", "zero");
    shape_err(&[], GgmlType::Q8_0, "no dims", "dimensions");
    shape_err(&[32, 1, 1, 1, 1], GgmlType::Q8_0, "five dims", "dimensions");
    shape_err(
        &[48],
        GgmlType::Q8_0,
        "row not a block multiple",
        "block size",
    );
    shape_err(
        &[128, 3],
        GgmlType::Q4_K,
        "row not a K block multiple",
        "block size",
    );
    shape_err(
        &[1 << 32, 1 << 32, 1 << 32],
        GgmlType::F32,
        "element count overflow",
        "overflows",
    );
    shape_err(
        &[1 << 31, 1 << 31, 2],
        GgmlType::F32,
        "byte size overflow",
        "overflows",
    );
    shape_err(&[u64::MAX - 31], GgmlType::Q8_0, "huge row", "");

    for type_id in [4u32, 5, 17, 29, 31, 1000, u32::MAX] {
        let mut r = two_tensors();
        r.tensors[1].type_id = type_id;
        expect_err(
            &r,
            "unknown type",
            &["blk.0.b", &type_id.to_string()],
            |e| matches!(e, GgufError::UnknownTensorType { type_id: t, .. } if *t == type_id),
        );
    }
}

#[test]
fn key_errors() {
    let r = two_tensors().kv("general.architecture", typed_str("gpt2"));
    expect_err(&r, "duplicate key", &["general.architecture"], |e| {
        matches!(e, GgufError::DuplicateKey { .. })
    });

    for bad in [0u32, 3, 48, 1 << 31] {
        let r = two_tensors().kv("general.alignment", typed_u32(bad));
        expect_err(
            &r,
            "bad alignment",
            &["general.alignment", &bad.to_string()],
            |e| matches!(e, GgufError::BadAlignment { value } if *value == u64::from(bad)),
        );
    }
    let r = two_tensors().kv("general.alignment", typed_str("32"));
    expect_err(&r, "string alignment", &["general.alignment"], |e| {
        matches!(e, GgufError::WrongKeyType { .. })
    });

    let r = two_tensors().kv("odd.type", typed(13, &[0; 8]));
    expect_err(&r, "unknown value type", &["odd.type", "13"], |e| {
        matches!(e, GgufError::BadValueType { type_id: 13, .. })
    });

    let mut arr = 99u32.to_le_bytes().to_vec();
    arr.extend_from_slice(&1u64.to_le_bytes());
    let r = two_tensors().kv("odd.array", typed(vt::ARRAY, &arr));
    expect_err(
        &r,
        "unknown array element type",
        &["odd.array", "99"],
        |e| matches!(e, GgufError::BadValueType { type_id: 99, .. }),
    );

    let r = two_tensors().kv("odd.bool", typed(vt::BOOL, &[2]));
    expect_err(&r, "bool byte 2", &["odd.bool"], |e| {
        matches!(e, GgufError::BadValue { .. })
    });

    let mut bad_utf8 = 2u64.to_le_bytes().to_vec();
    bad_utf8.extend_from_slice(&[0xc3, 0x28]);
    let r = two_tensors().kv("odd.utf8", typed(vt::STRING, &bad_utf8));
    expect_err(&r, "bad utf-8 value", &["odd.utf8"], |e| {
        matches!(e, GgufError::BadUtf8 { .. })
    });

    let mut r = two_tensors();
    r.tensors[0].name = String::from_utf8_lossy(&[0xff]).into_owned();
    let mut bytes = r.build();
    let at = bytes
        .windows(3)
        .position(|w| w == [0xef, 0xbf, 0xbd])
        .unwrap();
    // Replace the 3-byte U+FFFD by 0xff 0xff 0xff: same length, invalid UTF-8.
    bytes[at..at + 3].copy_from_slice(&[0xff; 3]);
    let e = open_bytes(&bytes).unwrap_err();
    assert!(matches!(inner(&e), GgufError::BadUtf8 { .. }), "{e:?}");
    assert!(e.to_string().contains("tensor name"), "{e}");
}

// ---- split models ----

struct Split {
    dir: tempfile::TempDir,
}

impl Split {
    fn path(&self, no: u32, of: u32) -> std::path::PathBuf {
        self.dir.path().join(format!("m-{no:05}-of-{of:05}.gguf"))
    }
}

fn split_tensors() -> Vec<Vec<TensorToWrite>> {
    vec![
        vec![
            tensor("token_embd.weight", &[64, 4], GgmlType::Q8_0),
            tensor("output_norm.weight", &[64], GgmlType::F32),
        ],
        vec![
            tensor("blk.0.attn_q.weight", &[64, 2], GgmlType::Q4_1),
            tensor("blk.0.ffn_up.weight", &[256], GgmlType::Q4_K),
        ],
        vec![tensor("output.weight", &[64, 4], GgmlType::F16)],
    ]
}

/// Shard `i` (0-based) metadata with gguf-split's key types (u16, u16, i32).
fn split_meta(i: usize, count: u16, total: i32) -> Vec<(String, MetaValue)> {
    let mut m = Vec::new();
    if i == 0 {
        m.push((
            "general.architecture".to_string(),
            MetaValue::String("llama".into()),
        ));
        m.push(("llama.block_count".to_string(), MetaValue::U32(1)));
    }
    m.push(("split.no".to_string(), MetaValue::U16(i as u16)));
    m.push(("split.count".to_string(), MetaValue::U16(count)));
    m.push(("split.tensors.count".to_string(), MetaValue::I32(total)));
    m
}

fn write_split(
    edit: impl Fn(usize, &mut Vec<(String, MetaValue)>, &mut Vec<TensorToWrite>),
) -> Split {
    let dir = tempfile::tempdir().unwrap();
    let s = Split { dir };
    for (i, mut tensors) in split_tensors().into_iter().enumerate() {
        let mut meta = split_meta(i, 3, 5);
        edit(i, &mut meta, &mut tensors);
        std::fs::write(s.path(i as u32 + 1, 3), write_gguf(&meta, &tensors, 32)).unwrap();
    }
    s
}

fn set(meta: &mut [(String, MetaValue)], key: &str, v: MetaValue) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
}

#[test]
fn split_model_opens_from_first_shard() {
    let s = write_split(|_, _, _| {});
    let f = GgufFile::open(&s.path(1, 3)).expect("split model opens");
    assert_eq!(f.shards().len(), 3);
    for (i, sh) in f.shards().iter().enumerate() {
        assert_eq!(sh.path, s.path(i as u32 + 1, 3));
    }
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.metadata().get_u64("split.count"), Some(3));
    let want = split_tensors();
    assert_eq!(f.tensors().len(), 5);
    let mut k = 0;
    for (shard, list) in want.iter().enumerate() {
        for w in list {
            let t = &f.tensors()[k];
            assert_eq!((t.name.as_str(), t.shard), (w.name.as_str(), shard));
            assert_eq!(f.tensor_data(t), &w.data[..], "{}", w.name);
            assert_eq!(f.tensor(&w.name).unwrap().shard, shard);
            k += 1;
        }
    }
    assert_eq!(
        f.tensor_bytes(),
        want.iter()
            .flatten()
            .map(|t| t.data.len() as u64)
            .sum::<u64>()
    );
}

#[test]
fn split_second_shard_is_refused() {
    let s = write_split(|_, _, _| {});
    let e = GgufFile::open(&s.path(2, 3)).unwrap_err();
    assert!(matches!(e, GgufError::Split { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("open the first shard") && msg.contains("m-00001-of-00003.gguf"),
        "{msg}"
    );

    // A shard number at the top of the u64 range is refused the same way.
    let s = write_split(|i, m, _| {
        if i == 1 {
            set(m, "split.no", MetaValue::U64(u64::MAX))
        }
    });
    let e = GgufFile::open(&s.path(2, 3)).unwrap_err();
    assert!(matches!(e, GgufError::Split { .. }), "{e:?}");
}

#[test]
fn split_missing_shard_names_the_path() {
    let s = write_split(|_, _, _| {});
    std::fs::remove_file(s.path(3, 3)).unwrap();
    let e = GgufFile::open(&s.path(1, 3)).unwrap_err();
    assert!(
        matches!(&e, GgufError::Io { path, .. } if *path == s.path(3, 3)),
        "{e:?}"
    );
    assert!(e.to_string().contains("m-00003-of-00003.gguf"), "{e}");
}

#[test]
fn split_inconsistencies_are_split_errors() {
    #[track_caller]
    fn refused(s: &Split, needle: &str) {
        let e = GgufFile::open(&s.path(1, 3)).unwrap_err();
        assert!(matches!(e, GgufError::Split { .. }), "{needle}: {e:?}");
        assert!(e.to_string().contains(needle), "{e}");
    }
    // split.count disagrees with the name of the first shard.
    refused(
        &write_split(|i, m, _| {
            if i == 0 {
                set(m, "split.count", MetaValue::U16(2))
            }
        }),
        "split.count = 2",
    );
    // split.tensors.count disagrees with the tensors found.
    refused(
        &write_split(|i, m, _| {
            if i == 0 {
                set(m, "split.tensors.count", MetaValue::I32(4))
            }
        }),
        "split.tensors.count",
    );
    // A later shard with the wrong number.
    refused(
        &write_split(|i, m, _| {
            if i == 2 {
                set(m, "split.no", MetaValue::U16(1))
            }
        }),
        "split.no",
    );
    // A later shard that disagrees on the count.
    refused(
        &write_split(|i, m, _| {
            if i == 1 {
                set(m, "split.count", MetaValue::U16(4))
            }
        }),
        "split.count",
    );
    // A later shard without split keys.
    refused(
        &write_split(|i, m, _| {
            if i == 1 {
                m.clear()
            }
        }),
        "split.no",
    );
    // Named like a first shard, but no split keys.
    refused(
        &write_split(|i, m, _| {
            if i == 0 {
                m.retain(|(k, _)| !k.starts_with("split."))
            }
        }),
        "split.count",
    );
    // split.count of the wrong type.
    let s = write_split(|i, m, _| {
        if i == 0 {
            set(m, "split.count", MetaValue::String("3".into()))
        }
    });
    let e = GgufFile::open(&s.path(1, 3)).unwrap_err();
    assert!(matches!(inner(&e), GgufError::WrongKeyType { .. }), "{e:?}");
    assert!(e.to_string().contains("split.count"), "{e}");

    // The same tensor in two shards.
    let s = write_split(|i, _, t| {
        if i == 2 {
            t[0].name = "output_norm.weight".into()
        }
    });
    let e = GgufFile::open(&s.path(1, 3)).unwrap_err();
    assert!(
        matches!(inner(&e), GgufError::DuplicateTensor { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("output_norm.weight"), "{e}");
}

#[test]
fn split_keys_on_a_file_not_named_as_a_shard() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(
        dir.path(),
        "m.gguf",
        &write_gguf(&split_meta(0, 3, 5), &split_tensors()[0], 32),
    );
    let e = GgufFile::open(&path).unwrap_err();
    assert!(matches!(e, GgufError::Split { .. }), "{e:?}");
    assert!(e.to_string().contains("NAME-00001-of-00003.gguf"), "{e}");

    // A one-shard "split" (split.count = 1) is just a file.
    let path = write_file(
        dir.path(),
        "one.gguf",
        &write_gguf(&split_meta(0, 1, 2), &split_tensors()[0], 32),
    );
    assert_eq!(GgufFile::open(&path).unwrap().tensors().len(), 2);
}

// ---- the default model ----

#[test]
fn default_model_header() {
    let path = common::model_path();
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(f.tensors().len(), 272);
    assert_eq!(f.architecture(), Some("llama"));
    assert_eq!(f.metadata().get_u64("llama.block_count"), Some(30));
    let t = f.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(t.ggml_type, GgmlType::Q8_0);
    assert_eq!(t.shape, vec![576, 49152]);
    assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(f.tensors().iter().all(|t| t.file_offset + t.n_bytes <= len));
    assert!(f.tensor_bytes() <= len);
    assert_eq!(f.shards().len(), 1);
    assert!(Path::new(&f.shards()[0].path).exists());
}
