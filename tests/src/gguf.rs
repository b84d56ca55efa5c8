//! Just enough of the GGUF format (written from the spec,
//! <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>, not with
//! the reader under test) to find a tensor's bytes in a model file, so
//! that a test can damage them.

/// A tensor's place in a GGUF file.
#[derive(Clone, Copy, Debug)]
pub struct TensorAt {
    /// Absolute byte offset of its data in the file.
    pub offset: usize,
    /// ggml type id (2: Q4_0, 3: Q4_1, 8: Q8_0, 0: F32, ...).
    pub ggml_type: u32,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        s
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().unwrap())
    }
    fn string(&mut self) -> String {
        let n = self.u64() as usize;
        String::from_utf8_lossy(self.take(n)).into_owned()
    }
    /// Skip a value of type `t`; returns it when it is an unsigned integer.
    fn value(&mut self, t: u32) -> Option<u64> {
        match t {
            0 | 1 | 7 => Some(u64::from(self.take(1)[0])),
            2 | 3 => Some(u64::from(u16::from_le_bytes(
                self.take(2).try_into().unwrap(),
            ))),
            4..=6 => Some(u64::from(self.u32())),
            8 => {
                self.string();
                None
            }
            9 => {
                let (elem, n) = (self.u32(), self.u64());
                for _ in 0..n {
                    self.value(elem);
                }
                None
            }
            10..=12 => Some(self.u64()),
            other => panic!("GGUF value type {other} at byte {}", self.at),
        }
    }
}

/// Where tensor `name` lies in the GGUF file `bytes`.
pub fn tensor_at(bytes: &[u8], name: &str) -> Option<TensorAt> {
    assert_eq!(&bytes[..4], b"GGUF", "not a GGUF file");
    let mut c = Cursor { b: bytes, at: 8 };
    let (n_tensors, n_kv) = (c.u64(), c.u64());
    let mut alignment = 32u64;
    for _ in 0..n_kv {
        let key = c.string();
        let t = c.u32();
        let v = c.value(t);
        if key == "general.alignment" {
            alignment = v.expect("an integer alignment");
        }
    }
    let mut found = None;
    for _ in 0..n_tensors {
        let tensor = c.string();
        let dims = c.u32();
        for _ in 0..dims {
            c.u64();
        }
        let (ggml_type, offset) = (c.u32(), c.u64());
        if tensor == name {
            found = Some((offset, ggml_type));
        }
    }
    let data = (c.at as u64).div_ceil(alignment) * alignment;
    found.map(|(offset, ggml_type)| TensorAt {
        offset: (data + offset) as usize,
        ggml_type,
    })
}
