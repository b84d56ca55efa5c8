//! `--check-tensors`: every tensor's data scanned for non-finite values
//! (float tensors) and non-finite block scales (quantized tensors), as
//! llama.cpp's option of that name. Off by default: it reads every byte
//! of the weights.

use super::{GgufError, GgufFile, TensorInfo};

/// Check one tensor's bytes (`data`: the tensor's bytes wherever they
/// were placed, in the file's type and length).
pub fn check_tensor(t: &TensorInfo, data: &[u8]) -> Result<(), GgufError> {
    match ds4_kernels::quant::find_non_finite(t.ggml_type, data) {
        None => Ok(()),
        Some(bad) => Err(GgufError::NonFinite {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            block: bad.block,
            field: bad.field,
            value: bad.value,
            byte: bad.byte,
        }),
    }
}

/// Check every tensor of `file` in file order; the error names the shard
/// holding the first bad tensor.
pub fn check_tensors(file: &GgufFile) -> Result<(), GgufError> {
    for t in file.tensors() {
        check_tensor(t, file.tensor_data(t))
            .map_err(|e| e.in_file(&file.shards()[t.shard].path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::writer::{write_gguf, TensorToWrite};
    use ds4_kernels::quant::GgmlType;

    #[test]
    fn names_the_tensor_and_its_first_bad_block() {
        let mut q8 = vec![0u8; GgmlType::Q8_0.type_size() * 4];
        for b in [1, 3] {
            let at = b * GgmlType::Q8_0.type_size();
            q8[at..at + 2].copy_from_slice(&0x7c01u16.to_le_bytes());
        }
        let tensors = [
            TensorToWrite {
                name: "norm".into(),
                shape: vec![4],
                ggml_type: GgmlType::F32,
                data: [1.0f32, 2.0, 3.0, 4.0]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            },
            TensorToWrite {
                name: "proj".into(),
                shape: vec![128],
                ggml_type: GgmlType::Q8_0,
                data: q8,
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nan.gguf");
        std::fs::write(&path, write_gguf(&[], &tensors, 32)).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let e = check_tensors(&file).unwrap_err();
        assert_eq!(e.path(), Some(path.as_path()));
        let line = e.report(&path, "");
        assert!(
            line.contains("tensor \"proj\" (q8_0): block 1's scale d is NaN (byte 34 of its data)")
                && line.ends_with("download or convert the model again"),
            "{line}"
        );
        assert!(check_tensor(&file.tensors()[0], file.tensor_data(&file.tensors()[0])).is_ok());
    }
}
