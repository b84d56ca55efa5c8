//! Region planning and the two identities of a loaded model.
//!
//! The owner and a standalone worker both call [`plan`], so a tensor lands
//! at the same region and offset whichever process placed it; with the
//! same source bytes the regions are byte-identical. [`gguf`] applies the
//! plan and the layout identity to a GGUF file; [`rank`] says what one
//! owner of a model split over several GPUs holds of it.

pub mod gguf;
pub mod rank;

use sha2::{Digest, Sha256};

/// Alignment of every tensor inside its region (vector loads, and the
/// largest quant block rows stay aligned).
pub const TENSOR_ALIGN: u64 = 256;
/// The largest region the owner creates (one CUDA VMM allocation or memfd).
pub const MAX_REGION_BYTES: u64 = 2 << 30;
/// The granularity of host regions (the page size): the owner's sealed
/// memfds and a standalone worker's own copies are planned with it.
pub const HOST_GRANULARITY: u64 = 4096;

/// One tensor to place: its name and size in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item<'a> {
    pub name: &'a str,
    pub bytes: u64,
}

/// Where a tensor goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub region: u32,
    pub offset: u64,
}

/// Regions (sizes, multiples of the granularity) and one placement per
/// input item, in input order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub region_bytes: Vec<u64>,
    pub placements: Vec<Placement>,
}

impl Plan {
    pub fn total_bytes(&self) -> u64 {
        self.region_bytes.iter().sum()
    }
}

fn round_up(v: u64, to: u64) -> u64 {
    v.div_ceil(to) * to
}

/// Pack `items` in order into regions of at most `max_region` bytes, each a
/// multiple of `granularity`; every tensor starts at a multiple of
/// [`TENSOR_ALIGN`]. A tensor larger than `max_region` gets a region of its
/// own, rounded up to the granularity.
pub fn plan(items: &[Item<'_>], granularity: u64, max_region: u64) -> Plan {
    let granularity = granularity.max(1);
    let max_region = round_up(max_region.max(granularity), granularity);
    let mut region_bytes = Vec::new();
    let mut placements = Vec::with_capacity(items.len());
    let mut used: u64 = 0;
    let mut open = false;
    for item in items {
        let offset = round_up(used, TENSOR_ALIGN);
        if open && offset + item.bytes > max_region {
            region_bytes.push(round_up(used, granularity));
            open = false;
        }
        if !open {
            used = 0;
            open = true;
        }
        let offset = round_up(used, TENSOR_ALIGN);
        placements.push(Placement {
            region: region_bytes.len() as u32,
            offset,
        });
        used = offset + item.bytes;
    }
    if open {
        region_bytes.push(round_up(used.max(1), granularity));
    }
    Plan {
        region_bytes,
        placements,
    }
}

/// One tensor's description for the layout identity.
#[derive(Clone, Debug)]
pub struct TensorDesc<'a> {
    pub name: &'a str,
    pub ggml_type: u32,
    pub shape: &'a [u64],
    pub bytes: u64,
}

/// `sha256:<hex>` over every shard's header bytes and file size, then every
/// tensor's name, type, shape and size. Cheap (headers only): a worker
/// recomputes it from its own model file and compares it with the manifest.
pub fn layout_identity<'a>(
    shards: impl IntoIterator<Item = (&'a [u8], u64)>,
    tensors: impl IntoIterator<Item = TensorDesc<'a>>,
) -> String {
    let mut h = Sha256::new();
    h.update(b"ds4.layout/1\0");
    for (header, file_bytes) in shards {
        h.update((header.len() as u64).to_le_bytes());
        h.update(header);
        h.update(file_bytes.to_le_bytes());
    }
    for t in tensors {
        h.update((t.name.len() as u64).to_le_bytes());
        h.update(t.name.as_bytes());
        h.update(t.ggml_type.to_le_bytes());
        h.update((t.shape.len() as u64).to_le_bytes());
        for d in t.shape {
            h.update(d.to_le_bytes());
        }
        h.update(t.bytes.to_le_bytes());
    }
    format!("sha256:{}", hex(&h.finalize()))
}

/// The content identity: sha256 of every tensor's bytes in manifest order,
/// fed while uploading.
#[derive(Clone, Debug, Default)]
pub struct ContentHasher(Sha256);

impl ContentHasher {
    pub fn new() -> ContentHasher {
        ContentHasher(Sha256::new())
    }

    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> String {
        format!("sha256:{}", hex(&self.0.finalize()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The family name of a synthetic manifest: regions filled with
/// [`synthetic_byte`] instead of a model, for measuring device import.
pub const SYNTHETIC_FAMILY: &str = "synthetic";

/// The byte at `offset` of synthetic region `region`. Period 256, so any
/// 256-aligned chunk of a region starts the same way.
pub fn synthetic_byte(region: u32, offset: u64) -> u8 {
    (offset as u8).wrapping_mul(7).wrapping_add(region as u8)
}

/// The identity of a synthetic fill: the pattern and the region sizes.
pub fn synthetic_identity(region_bytes: &[u64]) -> String {
    let mut h = Sha256::new();
    h.update(b"ds4.synthetic/1\0");
    for b in region_bytes {
        h.update(b.to_le_bytes());
    }
    format!("sha256:{}", hex(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_packs_aligns_and_splits() {
        let items = [
            Item {
                name: "a",
                bytes: 100,
            },
            Item {
                name: "b",
                bytes: 1000,
            },
            Item {
                name: "c",
                bytes: 3000,
            },
            Item {
                name: "d",
                bytes: 10_000,
            },
        ];
        let p = plan(&items, 1024, 4096);
        assert_eq!(
            p.placements[0],
            Placement {
                region: 0,
                offset: 0
            }
        );
        assert_eq!(
            p.placements[1],
            Placement {
                region: 0,
                offset: 256
            }
        );
        // 1256 rounded to 1280, + 3000 > 4096: a new region.
        assert_eq!(
            p.placements[2],
            Placement {
                region: 1,
                offset: 0
            }
        );
        // Larger than a region: its own region.
        assert_eq!(
            p.placements[3],
            Placement {
                region: 2,
                offset: 0
            }
        );
        assert_eq!(p.region_bytes, vec![2048, 3072, 10_240]);
        for (i, pl) in p.placements.iter().enumerate() {
            assert_eq!(pl.offset % TENSOR_ALIGN, 0);
            assert!(pl.offset + items[i].bytes <= p.region_bytes[pl.region as usize]);
        }
    }

    #[test]
    fn layout_identity_sees_every_field() {
        let shape = [4u64, 2];
        let base = |name, ty, bytes| TensorDesc {
            name,
            ggml_type: ty,
            shape: &shape,
            bytes,
        };
        let a = layout_identity([(&b"hdr"[..], 10)], [base("t", 0, 32)]);
        assert_eq!(a, layout_identity([(&b"hdr"[..], 10)], [base("t", 0, 32)]));
        assert_ne!(a, layout_identity([(&b"hdx"[..], 10)], [base("t", 0, 32)]));
        assert_ne!(a, layout_identity([(&b"hdr"[..], 11)], [base("t", 0, 32)]));
        assert_ne!(a, layout_identity([(&b"hdr"[..], 10)], [base("u", 0, 32)]));
        assert_ne!(a, layout_identity([(&b"hdr"[..], 10)], [base("t", 1, 32)]));
        assert!(a.starts_with("sha256:") && a.len() == 7 + 64);
    }
}
