//! Shared checks of a family's tensor inventory against a file.

use super::{Family, ModelError};
use crate::gguf::GgufFile;

/// A tensor a family expects, with its ggml shape (row length first).
#[derive(Clone, Debug)]
pub struct ExpectedTensor {
    pub name: String,
    pub shape: Vec<u64>,
    pub required: bool,
}

impl ExpectedTensor {
    pub fn required(name: impl Into<String>, shape: &[u64]) -> ExpectedTensor {
        ExpectedTensor {
            name: name.into(),
            shape: shape.to_vec(),
            required: true,
        }
    }

    pub fn optional(name: impl Into<String>, shape: &[u64]) -> ExpectedTensor {
        ExpectedTensor {
            name: name.into(),
            shape: shape.to_vec(),
            required: false,
        }
    }
}

/// Every required tensor present with its shape, optional ones with their
/// shape when present, and nothing else in the file.
pub fn check_inventory(
    file: &GgufFile,
    family: Family,
    expected: &[ExpectedTensor],
    unexpected_hint: &'static str,
) -> Result<(), ModelError> {
    let fam = family.name();
    for e in expected {
        match file.tensor(&e.name) {
            None if e.required => {
                return Err(ModelError::MissingTensor {
                    family: fam,
                    name: e.name.clone(),
                });
            }
            None => {}
            Some(t) if t.shape != e.shape => {
                return Err(ModelError::TensorShape {
                    family: fam,
                    name: e.name.clone(),
                    expected: e.shape.clone(),
                    found: t.shape.clone(),
                });
            }
            Some(_) => {}
        }
    }
    let known: std::collections::HashSet<&str> = expected.iter().map(|e| e.name.as_str()).collect();
    if let Some(t) = file
        .tensors()
        .iter()
        .find(|t| !known.contains(t.name.as_str()))
    {
        return Err(ModelError::UnexpectedTensor {
            family: fam,
            name: t.name.clone(),
            hint: unexpected_hint,
        });
    }
    Ok(())
}
