//! Compile `ds4/control/v1/control.proto` into OUT_DIR with a vendored
//! `protoc`, so no system protobuf compiler is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build finds the compiler through PROTOC.
    std::env::set_var("PROTOC", protoc);
    println!("cargo:rerun-if-changed=ds4/control/v1/control.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["ds4/control/v1/control.proto"], &["."])?;
    Ok(())
}
