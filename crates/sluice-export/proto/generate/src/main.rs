//! Generates `../onnx.rs` from `../onnx.proto3` with prost-build (run from this folder: `cargo run --release`).

use std::path::Path;

fn main() {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let fds = protox::compile(["onnx.proto3"], [&proto]).unwrap_or_else(|e| panic!("compiling onnx.proto3: {e}"));
    prost_build::Config::new()
        .out_dir(&proto)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating onnx.rs: {e}"));
}
