//! Split models: `name-00001-of-0000N.gguf` plus the `split.*` keys that
//! llama.cpp's `gguf-split` writes (`split.no`, `split.count`,
//! `split.tensors.count`). The first shard carries the model metadata; the
//! others carry only their tensors.

use std::path::{Path, PathBuf};

use super::{GgufError, Metadata};

pub const KEY_NO: &str = "split.no";
pub const KEY_COUNT: &str = "split.count";
pub const KEY_TENSORS: &str = "split.tensors.count";

fn err(problem: String) -> GgufError {
    GgufError::Split { problem }
}

/// `(prefix, no, count)` of a file named `prefix-0000I-of-0000N.gguf` (1-based `no`).
pub fn parse_name(path: &Path) -> Option<(String, u32, u32)> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((prefix.to_string(), no.parse().ok()?, count.parse().ok()?))
}

/// The paths of shards 2..=N when `first` is the first shard of a split model.
pub fn other_shards(first: &Path, meta: &Metadata) -> Result<Vec<PathBuf>, GgufError> {
    // A split key of the wrong type is an error, not "not split".
    let get = |key| match meta.get(key) {
        None => Ok(None),
        Some(_) => meta
            .require_u64(key)
            .map(Some)
            .map_err(|e| e.in_file(first)),
    };
    let count_key = get(KEY_COUNT)?;
    let count = count_key.unwrap_or(1);
    let no = get(KEY_NO)?.unwrap_or(0);
    let by_name = parse_name(first);
    if count <= 1 {
        if let Some((_, n, c)) = by_name.filter(|&(_, _, c)| c > 1) {
            let found = match count_key {
                None => format!("has no {KEY_COUNT} key"),
                Some(k) => format!("has {KEY_COUNT} = {k}"),
            };
            return Err(err(format!(
                "{} is named as shard {n} of {c} but {found}; re-split it with gguf-split",
                first.display()
            )));
        }
        return Ok(Vec::new());
    }
    if no != 0 {
        let first_name = match &by_name {
            Some((prefix, _, _)) => format!("{prefix}-00001-of-{count:05}.gguf"),
            None => format!("…-00001-of-{count:05}.gguf"),
        };
        return Err(err(format!(
            "{} is shard {} of {count}; open the first shard ({first_name}) instead",
            first.display(),
            no.saturating_add(1)
        )));
    }
    if count > 9999 {
        return Err(err(format!("{KEY_COUNT} = {count} is not plausible")));
    }
    let Some((prefix, 1, named_count)) = by_name else {
        return Err(err(format!(
            "{} has {KEY_COUNT} = {count} but its name is not of the form NAME-00001-of-{count:05}.gguf",
            first.display()
        )));
    };
    if u64::from(named_count) != count {
        return Err(err(format!(
            "{} is named as one of {named_count} shards but {KEY_COUNT} = {count}",
            first.display()
        )));
    }
    let dir = first.parent().unwrap_or(Path::new(""));
    Ok((2..=count)
        .map(|i| dir.join(format!("{prefix}-{i:05}-of-{count:05}.gguf")))
        .collect())
}

/// Check that shard number `index` (0-based) agrees with the first shard.
pub fn check_shard_metadata(
    path: &Path,
    meta: &Metadata,
    index: usize,
    first: &Metadata,
) -> Result<(), GgufError> {
    let no = meta.get_u64(KEY_NO);
    let count = meta.get_u64(KEY_COUNT);
    if no != Some(index as u64) || count != first.get_u64(KEY_COUNT) {
        return Err(err(format!(
            "{}: expected {KEY_NO} = {index} and {KEY_COUNT} = {:?}, found {no:?} and {count:?}",
            path.display(),
            first.get_u64(KEY_COUNT)
        )));
    }
    Ok(())
}

/// Check `split.tensors.count` against the tensors found in all shards.
pub fn check_tensor_total(meta: &Metadata, found: usize) -> Result<(), GgufError> {
    match meta.get_u64(KEY_TENSORS) {
        Some(want) if meta.get_u64(KEY_COUNT).unwrap_or(1) > 1 && want != found as u64 => Err(err(
            format!("{KEY_TENSORS} = {want} but the shards hold {found} tensors"),
        )),
        _ => Ok(()),
    }
}
