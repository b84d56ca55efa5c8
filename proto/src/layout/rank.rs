//! One owner's part of a model split over several GPUs, expert-parallel:
//! rank `index` of `of` holds routed experts `[a, b)` of every routed
//! expert tensor (a balanced, contiguous range) and every other tensor
//! whole. A routed expert tensor (`*_exps.*`) keeps its experts along its
//! last (outermost) ggml dimension, so an expert range is one byte range
//! of the tensor, read straight from the file. The ranks of one model
//! together hold every expert exactly once.

use std::fmt;
use std::ops::Range;

use serde::{Deserialize, Serialize};

/// Which part of a model an owner holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rank {
    pub index: u32,
    pub of: u32,
}

/// What a tensor's entry in a rank's plan holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    /// Bytes of the tensor's data this rank holds.
    pub bytes: Range<u64>,
    /// For a routed expert tensor: the experts held.
    pub experts: Option<Range<u64>>,
}

impl Part {
    /// How many bytes the rank holds of the tensor.
    pub fn len(&self) -> u64 {
        self.bytes.end - self.bytes.start
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Rank {
    /// The whole model (one owner).
    pub const WHOLE: Rank = Rank { index: 0, of: 1 };

    /// `R/N`, `0 <= R < N`.
    pub fn parse(s: &str) -> Result<Rank, String> {
        let bad = || format!("{s:?} is not a rank: write INDEX/COUNT, e.g. 0/2");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let of: u32 = n.trim().parse().map_err(|_| bad())?;
        if of == 0 || index >= of {
            return Err(format!(
                "rank {index}/{of}: the index must be below the count"
            ));
        }
        Ok(Rank { index, of })
    }

    pub fn is_whole(&self) -> bool {
        self.of == 1
    }

    /// The experts of `n_expert` this rank holds.
    pub fn experts(&self, n_expert: u64) -> Range<u64> {
        let (i, n) = (u64::from(self.index), u64::from(self.of));
        n_expert * i / n..n_expert * (i + 1) / n
    }

    /// What this rank holds of a tensor named `name` of `shape` (ggml
    /// order) and `n_bytes`: a routed expert tensor's range of experts,
    /// any other tensor whole.
    pub fn part(&self, name: &str, shape: &[u64], n_bytes: u64) -> Part {
        let n_expert = shape.last().copied().unwrap_or(1);
        if self.is_whole() || !is_routed_experts(name) || n_expert < 2 {
            return Part {
                bytes: 0..n_bytes,
                experts: None,
            };
        }
        let per = n_bytes / n_expert;
        let e = self.experts(n_expert);
        Part {
            bytes: e.start * per..e.end * per,
            experts: Some(e),
        }
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.of)
    }
}

/// Whether a GGUF tensor holds routed experts (`blk.N.ffn_gate_exps.weight`
/// and the like; a shared expert's `_shexp` is not).
pub fn is_routed_experts(name: &str) -> bool {
    name.contains("_exps.")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_parse_and_refuse_nonsense() {
        assert_eq!(Rank::parse("1/4"), Ok(Rank { index: 1, of: 4 }));
        assert!(Rank::WHOLE.is_whole());
        for bad in ["", "2", "2/2", "0/0", "a/2", "-1/2"] {
            assert!(Rank::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_ranks_hold_every_expert_once() {
        for of in 1..=8u32 {
            for n_expert in [8u64, 64, 256, 257] {
                let mut next = 0;
                for index in 0..of {
                    let e = Rank { index, of }.experts(n_expert);
                    assert_eq!(e.start, next);
                    let len = e.end - e.start;
                    assert!(len == n_expert / u64::from(of) || len == n_expert / u64::from(of) + 1);
                    next = e.end;
                }
                assert_eq!(next, n_expert);
            }
        }
    }

    #[test]
    fn only_routed_experts_are_split() {
        let r = Rank { index: 1, of: 4 };
        let exps = r.part("blk.3.ffn_down_exps.weight", &[2048, 4096, 256], 256 * 1000);
        assert_eq!(exps.experts, Some(64..128));
        assert_eq!(exps.bytes, 64 * 1000..128 * 1000);
        for dense in [
            "blk.3.ffn_down_shexp.weight",
            "blk.3.attn_q_a.weight",
            "output.weight",
        ] {
            let p = r.part(dense, &[4096, 4096], 1000);
            assert_eq!((p.bytes, p.experts), (0..1000, None), "{dense}");
        }
        let whole = Rank::WHOLE.part("blk.3.ffn_down_exps.weight", &[8, 8, 256], 256 * 64);
        assert_eq!(whole.bytes, 0..256 * 64);
    }
}
