//! NVRTC compilation of the kernel sources in `kernels/cuda/`, with an
//! on-disk PTX cache.
//!
//! Every `.cu` file is embedded with `include_str!` and compiled with the
//! shared preludes (`common.cuh`, and `quant.cuh` + `iq2.cuh` for sources
//! that read weight blocks) prepended, since NVRTC sees no include path.
//!
//! Cache invariants: a cache file is named by the SHA-256 of everything
//! that determines its content (NVRTC version, options, target arch,
//! source text), so a stale file can never be picked up for changed
//! inputs; files are written to a temporary name, fsynced and renamed, so
//! a reader sees a whole file or none. The directory is
//! `$DS4_KERNEL_CACHE`, else `$XDG_CACHE_HOME/ds4/kernels`, else
//! `~/.cache/ds4/kernels`; when none can be created the cache is skipped.

// NVRTC's version and architecture queries are raw FFI calls.
#![allow(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{self, CompileOptions, Ptx};
use sha2::{Digest, Sha256};

const COMMON: &str = include_str!("../../cuda/common.cuh");
const QUANT: &str = include_str!("../../cuda/quant.cuh");
const IQ2: &str = include_str!("../../cuda/iq2.cuh");

/// One kernel source and the kernels the Rust side loads from it.
pub struct KernelSource {
    /// File stem in `kernels/cuda/` (also the module name).
    pub name: &'static str,
    src: &'static str,
    /// Whether `quant.cuh` and `iq2.cuh` are prepended.
    quant: bool,
    /// Whether its kernels may use all the dynamic shared memory a block
    /// can opt into (set when the module is loaded).
    pub big_smem: bool,
    pub kernels: &'static [&'static str],
}

impl KernelSource {
    /// The text NVRTC compiles: preludes, then the file.
    pub fn full_source(&self) -> String {
        self.assemble(COMMON, QUANT, IQ2, self.src)
    }

    /// [`KernelSource::full_source`] with each of its files read from
    /// `dir` where `dir` has it (`common.cuh`, `quant.cuh`, `iq2.cuh`,
    /// `<name>.cu`), else built in: for working on a kernel without
    /// rebuilding the binaries. The entry points stay this source's.
    pub fn full_source_from(&self, dir: &Path) -> Result<String, String> {
        let read = |file: String, built_in: &'static str| -> Result<String, String> {
            let path = dir.join(&file);
            match std::fs::read_to_string(&path) {
                Ok(text) => Ok(text),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(built_in.to_string()),
                Err(e) => Err(format!("kernel source {}: {e}", path.display())),
            }
        };
        Ok(self.assemble(
            &read("common.cuh".into(), COMMON)?,
            &read("quant.cuh".into(), QUANT)?,
            &read("iq2.cuh".into(), IQ2)?,
            &read(format!("{}.cu", self.name), self.src)?,
        ))
    }

    fn assemble(&self, common: &str, quant: &str, iq2: &str, src: &str) -> String {
        let mut s = String::with_capacity(common.len() + quant.len() + iq2.len() + src.len() + 96);
        s.push_str(common);
        if self.quant {
            s.push_str("\n#line 1 \"quant.cuh\"\n");
            s.push_str(quant);
            s.push_str("\n#line 1 \"iq2.cuh\"\n");
            s.push_str(iq2);
        }
        s.push_str(&format!("\n#line 1 \"{}.cu\"\n", self.name));
        s.push_str(src);
        s
    }
}

/// Every kernel source, with the kernel entry points it defines.
pub const SOURCES: &[KernelSource] = &[
    KernelSource {
        name: "elementwise",
        src: include_str!("../../cuda/elementwise.cu"),
        quant: true,
        big_smem: false,
        kernels: &[
            "rms_norm",
            "add_rms_norm",
            "swiglu",
            "add_assign",
            "add_bias",
            "rope",
            "argmax_rows",
            "zero_bytes",
        ],
    },
    KernelSource {
        name: "embed",
        src: include_str!("../../cuda/embed.cu"),
        quant: true,
        big_smem: false,
        kernels: &[
            "embed_f32",
            "embed_f16",
            "embed_q4_0",
            "embed_q4_1",
            "embed_q5_0",
            "embed_q8_0",
            "embed_q4_k",
            "embed_q5_k",
            "embed_q6_k",
            "embed_q2_k",
            "embed_iq2_xxs",
            "embed_i32",
        ],
    },
    KernelSource {
        name: "matmul",
        src: include_str!("../../cuda/matmul.cu"),
        quant: true,
        big_smem: false,
        kernels: &[
            "act_q8_0",
            "act_q8_k",
            "round_f16",
            "mv32_q4_0",
            "mv64_q4_0",
            "mv128_q4_0",
            "mmq8_q4_0",
            "mv32_q4_1",
            "mv64_q4_1",
            "mv128_q4_1",
            "mmq8_q4_1",
            "mv32_q5_0",
            "mv64_q5_0",
            "mv128_q5_0",
            "mmq8_q5_0",
            "mv32_q8_0",
            "mv64_q8_0",
            "mv128_q8_0",
            "mmq8_q8_0",
            "mv32_q4_k",
            "mv64_q4_k",
            "mv128_q4_k",
            "mv32_q4_k16",
            "mv64_q4_k16",
            "mv128_q4_k16",
            "mvr2_q4_k16",
            "mvs_q8_0",
            "mvsg_q8_0",
            "mvg32_q8_0",
            "mvg64_q8_0",
            "mvg128_q8_0",
            "mvt8_q4_k16",
            "mvt16_q4_k16",
            "mmq8_q4_k",
            "mv32_q5_k",
            "mv64_q5_k",
            "mv128_q5_k",
            "mmq8_q5_k",
            "mv32_q6_k",
            "mv64_q6_k",
            "mv128_q6_k",
            "mmq8_q6_k",
            "mma_q4_0",
            "mma_q4_1",
            "mma_q5_0",
            "mma_q8_0",
            "mma_q4_k",
            "mma_q5_k",
            "mma_q6_k",
            "mmf1_f32",
            "mmf8_f32",
            "mmf1_f16",
            "mmf8_f16",
            "mmf1_f16u",
            "mmf8_f16u",
            "mmf1_q4_0",
            "mmf8_q4_0",
            "mmf1_q4_1",
            "mmf8_q4_1",
            "mmf1_q5_0",
            "mmf8_q5_0",
            "mmf1_q8_0",
            "mmf8_q8_0",
            "mmf1_q4_k",
            "mmf8_q4_k",
            "mmf1_q5_k",
            "mmf8_q5_k",
            "mmf1_q6_k",
            "mmf8_q6_k",
            "mv32_q2_k",
            "mv64_q2_k",
            "mv128_q2_k",
            "mmq8_q2_k",
            "mma_q2_k",
            "mmf1_q2_k",
            "mmf8_q2_k",
            "mv32_iq2_xxs",
            "mv64_iq2_xxs",
            "mv128_iq2_xxs",
            "mmq8_iq2_xxs",
            "mma_iq2_xxs",
            "mmf1_iq2_xxs",
            "mmf8_iq2_xxs",
        ],
    },
    KernelSource {
        name: "matmul_tiled",
        src: include_str!("../../cuda/matmul_tiled.cu"),
        quant: true,
        big_smem: true,
        kernels: &[
            "mmt_split_sum",
            "mmt1_q4_0",
            "mmt2_q4_0",
            "mmt1_q4_1",
            "mmt2_q4_1",
            "mmt1_q5_0",
            "mmt2_q5_0",
            "mmt1_q8_0",
            "mmt2_q8_0",
            "mmt1_q4_k",
            "mmt2_q4_k",
            "mmt1_q5_k",
            "mmt2_q5_k",
            "mmt1_q6_k",
            "mmt2_q6_k",
            "mmt1_q2_k",
            "mmt2_q2_k",
            "mmt1_iq2_xxs",
            "mmt2_iq2_xxs",
            "mmg1_q8_0",
            "mmg2_q8_0",
            "mmgu1_q8_0",
            "mmgu2_q8_0",
            "mmg1_q4_k",
            "mmg2_q4_k",
            "mmgu1_q4_k",
            "mmgu2_q4_k",
            "mmg1_q5_k",
            "mmg2_q5_k",
            "mmgu1_q5_k",
            "mmgu2_q5_k",
            "mmg1_q6_k",
            "mmg2_q6_k",
            "mmgu1_q6_k",
            "mmgu2_q6_k",
            "mmg1_q2_k",
            "mmg2_q2_k",
            "mmgu1_q2_k",
            "mmgu2_q2_k",
            "mmg1_iq2_xxs",
            "mmg2_iq2_xxs",
            "mmgu1_iq2_xxs",
            "mmgu2_iq2_xxs",
        ],
    },
    KernelSource {
        name: "attention",
        src: include_str!("../../cuda/attention.cu"),
        quant: true,
        big_smem: false,
        kernels: &[
            "kv_store_f16",
            "kv_store_f32",
            "rope_kv_store_f16",
            "rope_kv_store_f32",
            "attn_part_f16_d2",
            "attn_part_f16_d4",
            "attn_part_f16_d16",
            "attn_part_f32_d2",
            "attn_part_f32_d4",
            "attn_part_f32_d16",
            "attn_merge",
        ],
    },
    KernelSource {
        name: "decode_layer",
        src: include_str!("../../cuda/decode_layer.cu"),
        quant: true,
        big_smem: true,
        kernels: &["decode_layer_q4_1"],
    },
    KernelSource {
        name: "compressed",
        src: include_str!("../../cuda/compressed.cu"),
        quant: false,
        big_smem: false,
        kernels: &[
            "comp_begin",
            "window_store",
            "compress_pool",
            "compress_frontier",
        ],
    },
    KernelSource {
        name: "indexer",
        src: include_str!("../../cuda/indexer.cu"),
        quant: false,
        big_smem: true,
        kernels: &["ix_score_mma", "ix_score_simt", "ix_topk"],
    },
    KernelSource {
        name: "compressed_attention",
        src: include_str!("../../cuda/compressed_attention.cu"),
        quant: false,
        big_smem: false,
        kernels: &[
            "comp_attn_d128",
            "comp_attn_d256",
            "comp_attn_d512",
            "comp_attn_merge",
        ],
    },
    KernelSource {
        name: "moe",
        src: include_str!("../../cuda/moe.cu"),
        quant: true,
        big_smem: false,
        kernels: &[
            "moe_route",
            "moe_plan",
            "moe_reduce",
            "moe_mv_q4_0",
            "moe_mvgu_q4_0",
            "moe_mv_q4_1",
            "moe_mvgu_q4_1",
            "moe_mv_q5_0",
            "moe_mvgu_q5_0",
            "moe_mv_q8_0",
            "moe_mvgu_q8_0",
            "moe_mv_q2_k",
            "moe_mvgu_q2_k",
            "moe_mv_q4_k",
            "moe_mvgu_q4_k",
            "moe_mv_q5_k",
            "moe_mvgu_q5_k",
            "moe_mv_q6_k",
            "moe_mvgu_q6_k",
            "moe_mv_iq2_xxs",
            "moe_mvgu_iq2_xxs",
            "moe_dv_q4_0",
            "moe_dvgu_q4_0",
            "moe_dv_q4_1",
            "moe_dvgu_q4_1",
            "moe_dv_q5_0",
            "moe_dvgu_q5_0",
            "moe_dv_q8_0",
            "moe_dvgu_q8_0",
            "moe_dv_q2_k",
            "moe_dvgu_q2_k",
            "moe_dv_q4_k",
            "moe_dvgu_q4_k",
            "moe_dv_q5_k",
            "moe_dvgu_q5_k",
            "moe_dv_q6_k",
            "moe_dvgu_q6_k",
            "moe_dv_iq2_xxs",
            "moe_dvgu_iq2_xxs",
            "moe_f_f32",
            "moe_fgu_f32",
            "moe_f_f16",
            "moe_fgu_f16",
            "moe_f_q4_0",
            "moe_fgu_q4_0",
            "moe_f_q4_1",
            "moe_fgu_q4_1",
            "moe_f_q5_0",
            "moe_fgu_q5_0",
            "moe_f_q8_0",
            "moe_fgu_q8_0",
            "moe_f_q2_k",
            "moe_fgu_q2_k",
            "moe_f_q4_k",
            "moe_fgu_q4_k",
            "moe_f_q5_k",
            "moe_fgu_q5_k",
            "moe_f_q6_k",
            "moe_fgu_q6_k",
            "moe_f_iq2_xxs",
            "moe_fgu_iq2_xxs",
        ],
    },
    KernelSource {
        name: "attention_prefill",
        src: include_str!("../../cuda/attention_prefill.cu"),
        quant: false,
        big_smem: false,
        kernels: &["attn_prefill_d64", "attn_prefill_d128"],
    },
    KernelSource {
        name: "hyper",
        src: include_str!("../../cuda/hyper.cu"),
        quant: false,
        big_smem: false,
        kernels: &[
            "hc_norm",
            "hc_mix_f16",
            "hc_mix_f32",
            "hc_mix_short_f16",
            "hc_mix_short_f32",
            "hc_split",
            "hc_post",
            "hc_sinkhorn",
            "rms_norm_heads",
            "rope_tail",
            "round_fp8",
            "round_indexer",
            "round_f16_inplace",
            "scale_inplace",
            "hc_expand",
            "swiglu_clamped",
        ],
    },
];

/// Whether libnvrtc can be loaded; `Err` says what was looked for.
pub fn nvrtc_available() -> Result<(), String> {
    // SAFETY: only tries to dlopen the library under its candidate names.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(format!(
            "libnvrtc not found (tried {:?} on the dynamic linker's path; \
             set LD_LIBRARY_PATH, e.g. to the output of scripts/lib/fetch-nvrtc.sh)",
            cudarc::get_lib_name_candidates("nvrtc")
        ))
    }
}

/// NVRTC's `(major, minor)` version. Call only after [`nvrtc_available`].
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-pointers to live integers.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| format!("nvrtcVersion: {e:?}"))?;
    Ok((major, minor))
}

/// The `sm_XX` numbers this NVRTC can target (e.g. `[75, 80, ..., 120]`).
pub fn supported_archs() -> Result<Vec<i32>, String> {
    let mut n = 0;
    // SAFETY: an out-pointer to a live integer.
    unsafe { nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| format!("nvrtcGetNumSupportedArchs: {e:?}"))?;
    let mut archs = vec![0i32; n.max(0) as usize];
    // SAFETY: `archs` holds the number of entries NVRTC just reported.
    unsafe { nvrtc::sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
        .result()
        .map_err(|e| format!("nvrtcGetSupportedArchs: {e:?}"))?;
    Ok(archs)
}

fn options(arch: u32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{arch}"),
        "--std=c++17".into(),
        "-lineinfo".into(),
    ]
}

/// Compile `src` to PTX for `compute_{arch}`; the error holds NVRTC's log.
pub fn compile_ptx(name: &str, src: &str, arch: u32) -> Result<String, String> {
    let opts = CompileOptions {
        options: options(arch),
        name: Some(format!("{name}.cu")),
        ..Default::default()
    };
    match nvrtc::compile_ptx_with_opts(src, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(nvrtc::CompileError::CompileError { log, options, .. }) => Err(format!(
            "NVRTC failed on {name}.cu (options {options:?}):\n{}",
            log.to_string_lossy()
        )),
        Err(e) => Err(format!("NVRTC failed on {name}.cu: {e}")),
    }
}

/// Counts of modules compiled and loaded from the disk cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileStats {
    pub compiled: usize,
    pub cached: usize,
}

/// The kernel cache directory (see the module doc), created if missing.
pub fn cache_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let dir = env("DS4_KERNEL_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("ds4/kernels")))
        .or_else(|| env("HOME").map(|d| d.join(".cache/ds4/kernels")))?;
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir)
}

fn cache_key(src: &str, arch: u32) -> String {
    let (major, minor) = nvrtc_version().unwrap_or((0, 0));
    let mut h = Sha256::new();
    h.update(format!("nvrtc {major}.{minor}\0").as_bytes());
    for o in options(arch) {
        h.update(o.as_bytes());
        h.update(b"\0");
    }
    h.update(format!("arch {arch}\0").as_bytes());
    h.update(src.as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// The PTX of `source` for `arch` (its files from `dir` where given, see
/// [`KernelSource::full_source_from`]): from the disk cache when present,
/// otherwise compiled (and stored). Updates `stats`.
pub fn load_or_compile(
    source: &KernelSource,
    arch: u32,
    dir: Option<&Path>,
    stats: &mut CompileStats,
) -> Result<Ptx, String> {
    let src = match dir {
        Some(d) => source.full_source_from(d)?,
        None => source.full_source(),
    };
    let dir = cache_dir();
    let path = dir
        .as_ref()
        .map(|d| d.join(format!("{}-{}.ptx", source.name, cache_key(&src, arch))));
    if let Some(p) = &path {
        if let Ok(text) = std::fs::read_to_string(p) {
            if text.contains(".entry") {
                stats.cached += 1;
                return Ok(Ptx::from_src(text));
            }
        }
    }
    let ptx = compile_ptx(source.name, &src, arch)?;
    stats.compiled += 1;
    if let Some(p) = &path {
        // A cache that cannot be written only costs a recompile next time.
        let _ = write_atomic(p, ptx.as_bytes());
    }
    Ok(Ptx::from_src(ptx))
}
