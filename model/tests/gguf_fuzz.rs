//! Malformed and hostile GGUF input: every truncation of a small file,
//! seeded byte corruption, crafted counts and nesting, and structural
//! fuzzing of tensor layouts against an independent oracle. The reader must
//! answer each with a typed error (or a file whose every tensor is in
//! bounds), never a panic, and never spend time or memory in proportion to
//! a length the file merely claims.

mod gguf_support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ds4_kernels::quant::GgmlType;
use ds4_model::gguf::writer::write_gguf;
use ds4_model::gguf::{parse_header, GgufError, GgufFile, MetaValue, MAX_ARRAY_ELEMENTS};
use gguf_support::{
    inner, raw_tensor, tensor, typed, typed_u32, vt, write_file, RawGguf, XorShift,
};

/// A few hundred bytes: metadata of several kinds and three tensors, the
/// last ending exactly at the end of the file.
fn small_file() -> Vec<u8> {
    let meta = vec![
        (
            "general.architecture".to_string(),
            MetaValue::String("llama".into()),
        ),
        ("llama.block_count".to_string(), MetaValue::U32(1)),
        ("f".to_string(), MetaValue::F32(0.5)),
        (
            "toks".to_string(),
            MetaValue::Array(vec![
                MetaValue::String("<s>".into()),
                MetaValue::String("a".into()),
            ]),
        ),
        (
            "nest".to_string(),
            MetaValue::Array(vec![
                MetaValue::Array(vec![MetaValue::I16(-1)]),
                MetaValue::Array(vec![]),
            ]),
        ),
        ("b".to_string(), MetaValue::Bool(true)),
    ];
    let tensors = vec![
        tensor("a", &[8], GgmlType::F32),
        tensor("b", &[32], GgmlType::Q8_0),
        tensor("c", &[16], GgmlType::F16),
    ];
    let bytes = write_gguf(&meta, &tensors, 32);
    let h = parse_header(&bytes).unwrap();
    assert_eq!(
        h.data_offset + 128,
        bytes.len() as u64,
        "last tensor ends the file"
    );
    bytes
}

/// Fresh file names in one temporary directory. Each input gets a new
/// file: rewriting one file in place costs milliseconds per write on ext4
/// (it flushes on truncate), creating a new one microseconds.
struct Scratch {
    dir: tempfile::TempDir,
    stem: &'static str,
    n: u32,
}

impl Scratch {
    fn new(stem: &'static str) -> Scratch {
        Scratch {
            dir: tempfile::tempdir().unwrap(),
            stem,
            n: 0,
        }
    }

    fn fresh(&mut self) -> PathBuf {
        self.n += 1;
        self.dir
            .path()
            .join(format!("{}-{}.gguf", self.stem, self.n))
    }
}

/// Open `bytes` as a new file, turning a panic into a test failure that
/// says which input caused it.
fn open_no_panic(
    scratch: &mut Scratch,
    bytes: &[u8],
    what: &dyn Fn() -> String,
) -> Result<GgufFile, GgufError> {
    let path = scratch.fresh();
    std::fs::write(&path, bytes).unwrap();
    match catch_unwind(AssertUnwindSafe(|| GgufFile::open(&path))) {
        Ok(r) => r,
        Err(_) => panic!("GgufFile::open panicked on {}", what()),
    }
}

fn parse_no_panic(bytes: &[u8], what: &dyn Fn() -> String) -> Result<(), GgufError> {
    match catch_unwind(|| parse_header(bytes).map(|_| ())) {
        Ok(r) => r,
        Err(_) => panic!("parse_header panicked on {}", what()),
    }
}

/// Everything an accepted file promises: tensors inside their shard,
/// aligned, not overlapping; metadata readable.
fn check_accepted(f: &GgufFile, what: &dyn Fn() -> String) {
    for (k, v) in f.metadata().iter() {
        let _ = format!("{k}{v:?}{}", v.type_name());
    }
    let _ = f.architecture();
    let mut spans = Vec::new();
    for t in f.tensors() {
        let shard = &f.shards()[t.shard];
        let len = shard.bytes().len() as u64;
        assert!(
            t.file_offset >= shard.data_offset,
            "{}: {} before data",
            what(),
            t.name
        );
        assert!(
            t.file_offset + t.n_bytes <= len,
            "{}: {} out of bounds",
            what(),
            t.name
        );
        assert_eq!(
            (t.file_offset - shard.data_offset) % shard.alignment,
            0,
            "{}",
            what()
        );
        assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes, "{}", what());
        spans.push((t.shard, t.file_offset, t.file_offset + t.n_bytes));
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(
            w[0].0 != w[1].0 || w[0].2 <= w[1].1,
            "{}: overlap accepted",
            what()
        );
    }
    assert!(f.shards()[0].header_bytes().len() <= f.shards()[0].bytes().len());
}

#[test]
fn every_truncation_is_an_error() {
    let full = small_file();
    let data_offset = parse_header(&full).unwrap().data_offset as usize;
    let mut scratch = Scratch::new("cut");
    let mut first_header_ok = None;
    for len in 0..full.len() {
        let cut = &full[..len];
        let what = || format!("a {len}-byte prefix of a {}-byte file", full.len());
        let parsed = parse_no_panic(cut, &what);
        match (&parsed, first_header_ok) {
            (Ok(()), None) => first_header_ok = Some(len),
            (Err(e), Some(ok)) => panic!(
                "{}: header parsed at {ok} bytes but not at {len}: {e}",
                what()
            ),
            _ => {}
        }
        if let Err(e) = &parsed {
            assert!(
                matches!(
                    e,
                    GgufError::Truncated { .. }
                        | GgufError::CountTooLarge { .. }
                        | GgufError::BadMagic { .. }
                ),
                "{}: {e:?}",
                what()
            );
        }
        let opened = open_no_panic(&mut scratch, cut, &what);
        let e = match opened {
            Ok(_) => panic!("{} opened", what()),
            Err(e) => e,
        };
        let expected = match (&parsed, inner(&e)) {
            (
                Err(_),
                GgufError::Truncated { .. }
                | GgufError::CountTooLarge { .. }
                | GgufError::BadMagic { .. },
            ) => true,
            // The whole header is there: the tensor checks refuse the cut data.
            (
                Ok(()),
                GgufError::Truncated {
                    what: "data section",
                    ..
                }
                | GgufError::BadTensor { .. },
            ) => true,
            _ => false,
        };
        assert!(expected, "{}: unexpected error {e:?}", what());
        assert!(e.to_string().contains("cut-"), "{}: {e}", what());
    }
    let ok = first_header_ok.expect("the whole header parses");
    assert!(
        ok <= data_offset && ok + 32 > data_offset,
        "header complete at {ok}, data at {data_offset}"
    );
    let f = open_no_panic(&mut scratch, &full, &|| "the full file".into()).unwrap();
    check_accepted(&f, &|| "the full file".into());
}

/// Counts that could each make a careless reader allocate or loop for ever.
const HOSTILE: [u64; 8] = [
    u64::MAX,
    1 << 40,
    1 << 63,
    1 << 32,
    u32::MAX as u64,
    (1 << 32) + 1,
    0x7fff_ffff_ffff_ffff,
    1 << 20,
];

#[test]
fn random_byte_corruption() {
    let bases = [small_file(), {
        let meta = vec![
            (
                "general.architecture".to_string(),
                MetaValue::String("llama".into()),
            ),
            (
                "v".to_string(),
                MetaValue::Array((0..20).map(|i| MetaValue::U64(i * 77)).collect()),
            ),
            (
                "s".to_string(),
                MetaValue::Array((0..5).map(|i| MetaValue::String("x".repeat(i))).collect()),
            ),
        ];
        let tensors = vec![
            tensor("q", &[256], GgmlType::Q4_K),
            tensor("r", &[64, 2], GgmlType::Q4_1),
        ];
        write_gguf(&meta, &tensors, 64)
    }];
    let mut scratch = Scratch::new("fuzz");
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let (mut accepted, mut refused) = (0u32, 0u32);
    let start = Instant::now();
    for iter in 0..4000u32 {
        let base = &bases[(iter % 2) as usize];
        let header_len = parse_header(base).unwrap().data_offset;
        let mut bytes = base.clone();
        let mut edits = Vec::new();
        for _ in 0..1 + rng.below(8) {
            // Mostly inside the header, where the structure is.
            let span = if rng.chance(4) {
                bytes.len() as u64
            } else {
                header_len
            };
            let at = rng.below(span) as usize;
            match rng.below(4) {
                0 => bytes[at] ^= 1 << rng.below(8),
                1 => bytes[at] = rng.next_u64() as u8,
                2 => bytes[at] = [0, 0xff, 0x7f, 0x80][rng.below(4) as usize],
                _ => {
                    // A hostile 8-byte little-endian count at `at`.
                    let v = HOSTILE[rng.below(HOSTILE.len() as u64) as usize].to_le_bytes();
                    let end = (at + 8).min(bytes.len());
                    bytes[at..end].copy_from_slice(&v[..end - at]);
                }
            }
            edits.push(at);
        }
        let what = || format!("iteration {iter} (bytes changed at {edits:?})");
        let t0 = Instant::now();
        let _ = parse_no_panic(&bytes, &what);
        match open_no_panic(&mut scratch, &bytes, &what) {
            Ok(f) => {
                check_accepted(&f, &what);
                accepted += 1;
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{} took {:?}",
            what(),
            t0.elapsed()
        );
    }
    // Both outcomes must be exercised for the test to mean anything.
    assert!(
        accepted > 100 && refused > 1000,
        "accepted {accepted}, refused {refused}"
    );
    eprintln!(
        "random_byte_corruption: {accepted} accepted, {refused} refused in {:?}",
        start.elapsed()
    );
}

fn header_with(n_tensors: u64, n_kv: u64, rest: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&n_tensors.to_le_bytes());
    b.extend_from_slice(&n_kv.to_le_bytes());
    b.extend_from_slice(rest);
    b
}

fn kv_bytes(key: &str, typed_value: &[u8]) -> Vec<u8> {
    let mut b = (key.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(typed_value);
    b
}

/// An array header: element type and length, followed by nothing.
fn array_of(elem: u32, len: u64) -> Vec<u8> {
    let mut b = elem.to_le_bytes().to_vec();
    b.extend_from_slice(&len.to_le_bytes());
    b
}

#[track_caller]
fn refused_quickly(bytes: &[u8], what: &str, check: impl Fn(&GgufError) -> bool) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "h.gguf", bytes);
    // Generous for a loaded machine; a reader that trusted any of these
    // counts would allocate terabytes or loop for minutes.
    let limit = Duration::from_millis(500);
    let t0 = Instant::now();
    let parsed = parse_header(bytes).map(|_| ()).unwrap_err();
    assert!(check(&parsed), "{what}: {parsed:?}");
    let e = GgufFile::open(&path).unwrap_err();
    assert!(check(inner(&e)), "{what}: {e:?}");
    assert!(t0.elapsed() < limit, "{what} took {:?}", t0.elapsed());
}

#[test]
fn array_elements_past_the_limit_are_refused_before_decoding() {
    // The bytes are all there (zeros are valid u8 values): only the element
    // cap stops the reader from building 16M values.
    let n = MAX_ARRAY_ELEMENTS + 1;
    let mut value = typed(vt::ARRAY, &array_of(vt::U8, n));
    value.resize(value.len() + n as usize, 0);
    let bytes = header_with(0, 1, &kv_bytes("big", &value));
    refused_quickly(
        &bytes,
        "array past the element limit",
        |e| matches!(e, GgufError::TooManyElements { count, .. } if *count == n),
    );
    assert!(parse_header(&bytes)
        .unwrap_err()
        .to_string()
        .contains("\"big\""));
}

#[test]
fn hostile_counts_and_lengths() {
    // A megabyte of zeros after the claims, so a count check against "the
    // rest of the file" is not trivially met by a tiny file.
    let tail = vec![0u8; 1 << 20];
    let too_many = |e: &GgufError| {
        matches!(
            e,
            GgufError::CountTooLarge { .. } | GgufError::Truncated { .. }
        )
    };
    for &n in &HOSTILE[..7] {
        refused_quickly(&header_with(n, 0, &tail), "tensor count", too_many);
        refused_quickly(&header_with(0, n, &tail), "key/value count", too_many);

        let mut key = n.to_le_bytes().to_vec();
        key.extend_from_slice(&tail);
        refused_quickly(&header_with(0, 1, &key), "key length", too_many);

        let mut value = typed(vt::STRING, &n.to_le_bytes());
        value.extend_from_slice(&tail);
        refused_quickly(
            &header_with(0, 1, &kv_bytes("k", &value)),
            "string value length",
            too_many,
        );

        for elem in [vt::U8, vt::BOOL, vt::U64, vt::STRING, vt::ARRAY] {
            let mut value = typed(vt::ARRAY, &array_of(elem, n));
            value.extend_from_slice(&tail);
            refused_quickly(
                &header_with(0, 1, &kv_bytes("k", &value)),
                "array length",
                too_many,
            );
        }

        // A tensor name length, and a tensor count that fits the tail but
        // whose infos are zeros (empty name, zero dimensions).
        let mut t = n.to_le_bytes().to_vec();
        t.extend_from_slice(&tail);
        refused_quickly(&header_with(1, 0, &t), "tensor name length", too_many);
    }
    refused_quickly(
        &header_with((1 << 20) / 24, 0, &tail),
        "zeroed tensor infos",
        |e| matches!(e, GgufError::BadTensor { .. }),
    );
    refused_quickly(
        &header_with(0, (1 << 20) / 13, &tail),
        "zeroed key/values",
        |e| matches!(e, GgufError::DuplicateKey { .. }),
    );
    // n_dims = u32::MAX.
    let mut t = 1u64.to_le_bytes().to_vec();
    t.push(b'w');
    t.extend_from_slice(&u32::MAX.to_le_bytes());
    t.extend_from_slice(&tail);
    refused_quickly(&header_with(1, 0, &t), "dimension count", |e| {
        matches!(e, GgufError::BadTensor { .. })
    });
}

/// `depth` arrays nested in each other, the innermost empty.
fn nested(depth: usize) -> Vec<u8> {
    let mut v = typed(vt::ARRAY, &[]);
    for _ in 1..depth {
        v.extend_from_slice(&array_of(vt::ARRAY, 1));
    }
    v.extend_from_slice(&array_of(vt::U8, 0));
    v
}

#[test]
fn deep_nesting_is_refused_and_the_limit_itself_parses() {
    let bytes = header_with(0, 1, &kv_bytes("deep", &nested(1000)));
    refused_quickly(&bytes, "depth 1000", |e| {
        matches!(e, GgufError::TooDeep { .. })
    });
    let e = parse_header(&bytes).unwrap_err();
    assert!(e.to_string().contains("deep"), "{e}");
    let GgufError::TooDeep { max, .. } = e else {
        unreachable!()
    };
    assert!((4..=64).contains(&max), "limit {max}");
    let h = parse_header(&header_with(0, 1, &kv_bytes("deep", &nested(max))))
        .expect("nesting at the limit");
    let mut v = h.metadata.get("deep").unwrap();
    for _ in 1..max {
        v = &v.as_array().unwrap()[0];
    }
    assert_eq!(v.as_array(), Some(&[][..]));
    refused_quickly(
        &header_with(0, 1, &kv_bytes("deep", &nested(max + 1))),
        "one past the limit",
        |e| matches!(e, GgufError::TooDeep { .. }),
    );
}

// ---- structural fuzz: random tensor layouts against an oracle ----

const TYPES: [GgmlType; 6] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_1,
    GgmlType::Q4_K,
];

/// Bytes of a tensor, or why the reader must refuse it.
fn oracle_bytes(dims: &[u64], type_id: u32) -> Option<u64> {
    if dims.is_empty() || dims.len() > 4 || dims.contains(&0) {
        return None;
    }
    let ty = GgmlType::from_id(type_id)?;
    let (bs, ts) = (ty.block_size() as u64, ty.type_size() as u64);
    if !dims[0].is_multiple_of(bs) {
        return None;
    }
    let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d))?;
    (n / bs).checked_mul(ts)
}

#[test]
fn random_tensor_layouts_match_an_oracle() {
    let mut scratch = Scratch::new("layout");
    let mut rng = XorShift(0xdead_beef_cafe_f00d);
    let names = ["w0", "w1", "w2", "w3", "w4", "w5"];
    let (mut accepted, mut refused) = (0u32, 0u32);
    let start = Instant::now();
    for iter in 0..3000u32 {
        let alignment = [32u64, 64, 128, 8, 1][rng.below(5) as usize];
        let mut raw = RawGguf {
            pad_to: alignment,
            ..Default::default()
        };
        if alignment != 32 {
            raw = raw.kv("general.alignment", typed_u32(alignment as u32));
        }
        let n = 1 + rng.below(5) as usize;
        let mut cursor = 0u64;
        for i in 0..n {
            let name = if rng.chance(20) { names[0] } else { names[i] };
            let ty = TYPES[rng.below(TYPES.len() as u64) as usize];
            let type_id = if rng.chance(30) {
                [4, 19, 99][rng.below(3) as usize]
            } else {
                ty.id()
            };
            let n_dims = if rng.chance(30) {
                [0, 5][rng.below(2) as usize]
            } else {
                1 + rng.below(3) as usize
            };
            let mut dims: Vec<u64> = (0..n_dims)
                .map(|_| [1, 2, 3][rng.below(3) as usize])
                .collect();
            if let Some(d0) = dims.first_mut() {
                *d0 = ty.block_size() as u64 * (1 + rng.below(2));
                if rng.chance(20) {
                    *d0 += 16;
                }
            }
            if rng.chance(40) && !dims.is_empty() {
                let k = rng.below(dims.len() as u64) as usize;
                dims[k] = [0, 1 << 40, u64::MAX][rng.below(3) as usize];
            }
            let size = oracle_bytes(&dims, type_id).unwrap_or(64).min(1 << 16);
            // Mostly packed in order; sometimes back, misaligned or far away.
            let offset = match rng.below(12) {
                0 => cursor.saturating_sub(alignment),
                1 => cursor + 1 + rng.below(alignment.max(2) - 1),
                2 => u64::MAX - rng.below(64),
                3 => cursor + alignment * rng.below(3),
                _ => cursor,
            };
            if offset < 1 << 20 {
                cursor = (offset + size).div_ceil(alignment) * alignment;
            }
            raw = raw.tensor(raw_tensor(name, &dims, type_id, offset));
        }
        let used = raw
            .tensors
            .iter()
            .filter_map(|t| oracle_bytes(&t.dims, t.type_id).and_then(|b| t.offset.checked_add(b)));
        let end = used.max().unwrap_or(0).min(1 << 17);
        let data_len = match rng.below(6) {
            0 => end.saturating_sub(1 + rng.below(8)),
            _ => end + rng.below(40),
        };
        raw.data = (0..data_len)
            .map(|i| (i * 7 + u64::from(iter)) as u8)
            .collect();

        // The oracle: every tensor well formed, aligned, inside the data,
        // unique names, pairwise disjoint.
        let spans: Option<Vec<(u64, u64)>> = raw
            .tensors
            .iter()
            .map(|t| {
                let b = oracle_bytes(&t.dims, t.type_id)?;
                let e = t.offset.checked_add(b)?;
                (t.offset % alignment == 0 && e <= data_len).then_some((t.offset, e))
            })
            .collect();
        let unique = {
            let mut ns: Vec<_> = raw.tensors.iter().map(|t| &t.name).collect();
            ns.sort();
            ns.windows(2).all(|w| w[0] != w[1])
        };
        let disjoint = spans.as_ref().is_some_and(|s| {
            s.iter()
                .enumerate()
                .all(|(i, a)| s[i + 1..].iter().all(|b| a.1 <= b.0 || b.1 <= a.0))
        });
        let should_open = spans.is_some() && unique && disjoint;

        let bytes = raw.build();
        let what = || {
            format!(
                "layout iteration {iter}: {:?}, {data_len} data bytes",
                raw.tensors
            )
        };
        match open_no_panic(&mut scratch, &bytes, &what) {
            Ok(f) => {
                assert!(should_open, "{} was accepted", what());
                check_accepted(&f, &what);
                for (t, r) in f.tensors().iter().zip(&raw.tensors) {
                    let o = r.offset as usize;
                    assert_eq!(
                        f.tensor_data(t),
                        &raw.data[o..o + t.n_bytes as usize],
                        "{}",
                        what()
                    );
                }
                accepted += 1;
            }
            Err(e) => {
                assert!(!should_open, "{} was refused: {e}", what());
                assert!(
                    matches!(
                        inner(&e),
                        GgufError::BadTensor { .. }
                            | GgufError::UnknownTensorType { .. }
                            | GgufError::Overlap { .. }
                            | GgufError::DuplicateTensor { .. }
                    ),
                    "{}: {e:?}",
                    what()
                );
                refused += 1;
            }
        }
    }
    assert!(
        accepted > 300 && refused > 300,
        "accepted {accepted}, refused {refused}"
    );
    eprintln!(
        "random_tensor_layouts: {accepted} accepted, {refused} refused in {:?}",
        start.elapsed()
    );
}

// ---- split models: corrupt one shard of three ----

#[test]
fn corrupt_split_shards() {
    let shard_tensors = [
        vec![tensor("a", &[32], GgmlType::Q8_0)],
        vec![tensor("b", &[8], GgmlType::F32)],
        vec![tensor("c", &[16], GgmlType::F16)],
    ];
    let shards: Vec<Vec<u8>> = shard_tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut meta = Vec::new();
            if i == 0 {
                meta.push((
                    "general.architecture".to_string(),
                    MetaValue::String("llama".into()),
                ));
            }
            meta.push(("split.no".to_string(), MetaValue::U16(i as u16)));
            meta.push(("split.count".to_string(), MetaValue::U16(3)));
            meta.push(("split.tensors.count".to_string(), MetaValue::I32(3)));
            write_gguf(&meta, t, 32)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = XorShift(0x0123_4567_89ab_cdef);
    let (mut accepted, mut refused) = (0u32, 0u32);
    for iter in 0..600u32 {
        let sub = dir.path().join(iter.to_string());
        std::fs::create_dir(&sub).unwrap();
        let victim = rng.below(3) as usize;
        let mut edits = Vec::new();
        for (i, base) in shards.iter().enumerate() {
            let mut bytes = base.clone();
            if i == victim {
                let header_len = parse_header(base).unwrap().data_offset;
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(header_len) as usize;
                    if rng.chance(3) {
                        let v = HOSTILE[rng.below(HOSTILE.len() as u64) as usize].to_le_bytes();
                        let end = (at + 8).min(bytes.len());
                        bytes[at..end].copy_from_slice(&v[..end - at]);
                    } else {
                        bytes[at] = rng.next_u64() as u8;
                    }
                    edits.push(at);
                }
            }
            write_file(&sub, &format!("m-{:05}-of-00003.gguf", i + 1), &bytes);
        }
        let first = sub.join("m-00001-of-00003.gguf");
        let what = || format!("split iteration {iter}: shard {victim} changed at {edits:?}");
        match catch_unwind(AssertUnwindSafe(|| GgufFile::open(&first))) {
            Ok(Ok(f)) => {
                check_accepted(&f, &what);
                accepted += 1;
            }
            Ok(Err(e)) => {
                assert!(!e.to_string().is_empty());
                refused += 1;
            }
            Err(_) => panic!("GgufFile::open panicked on {}", what()),
        }
    }
    assert!(
        accepted > 20 && refused > 300,
        "accepted {accepted}, refused {refused}"
    );
}
