//! Every CUDA kernel source compiles with NVRTC (no GPU needed, only
//! libnvrtc), defines every kernel the Rust wrappers load and no other
//! (an unlisted kernel is never loaded), and every
//! kernel waits for the one ahead of it (programmatic launches).
//!
//! Without libnvrtc the test says why and passes, unless
//! `DS4_REQUIRE_NVRTC` is set (CI sets it after
//! `scripts/lib/fetch-nvrtc.sh`).
#![cfg(feature = "cuda")]

use ds4_kernels::cuda::compile;

#[test]
fn every_kernel_source_compiles_with_nvrtc() {
    if let Err(why) = compile::nvrtc_available() {
        if std::env::var_os("DS4_REQUIRE_NVRTC").is_some() {
            panic!("DS4_REQUIRE_NVRTC is set but NVRTC cannot be loaded: {why}");
        }
        eprintln!("skipping the NVRTC compile test: {why}");
        return;
    }
    let version = compile::nvrtc_version().expect("NVRTC version");
    let supported = compile::supported_archs().expect("NVRTC architectures");
    let mut archs = vec![90u32];
    if supported.contains(&120) {
        archs.push(120);
    }
    eprintln!("NVRTC {version:?}; compiling for {archs:?} (supported: {supported:?})");
    let mut failures = Vec::new();
    for &arch in &archs {
        for src in compile::SOURCES {
            let t = std::time::Instant::now();
            match compile::compile_ptx(src.name, &src.full_source(), arch) {
                Ok(ptx) => {
                    for k in src.kernels {
                        if !ptx.contains(&format!(".entry {k}(")) {
                            failures.push(format!("{}.cu for sm_{arch}: no kernel {k}", src.name));
                        }
                    }
                    // The reverse: a kernel the module defines but does
                    // not list is never loaded, and its launch panics.
                    for (k, _) in entry_bodies(&ptx) {
                        if !src.kernels.contains(&k) {
                            failures.push(format!(
                                "{}.cu for sm_{arch}: kernel {k} is not in its SOURCES list (compile.rs), so it is never loaded",
                                src.name
                            ));
                        }
                    }
                    failures.extend(
                        kernels_without_pdl_wait(&ptx)
                            .into_iter()
                            .map(|k| format!("{}.cu for sm_{arch}: {k} never calls pdl_wait (the host launches every kernel with programmatic stream serialization)", src.name)),
                    );
                    eprintln!(
                        "{}.cu sm_{arch}: {} kernels, {} bytes of PTX, {:?}",
                        src.name,
                        src.kernels.len(),
                        ptx.len(),
                        t.elapsed()
                    );
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Kernels of `ptx` whose body has no `griddepcontrol.wait`: on sm_90+
/// every kernel may start before the one ahead of it has finished, so
/// each must wait (`pdl_wait` in common.cuh) before touching anything but
/// weights.
fn kernels_without_pdl_wait(ptx: &str) -> Vec<String> {
    entry_bodies(ptx)
        .filter(|(_, body)| !body.contains("griddepcontrol.wait"))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// Each kernel `ptx` defines: its name and the text from it to the next.
fn entry_bodies(ptx: &str) -> impl Iterator<Item = (&str, &str)> {
    ptx.split(".entry ")
        .skip(1)
        .map(|body| (body.split('(').next().unwrap_or("?").trim(), body))
}
