//! libFuzzer entry point; the checks live in `sluice_fuzz::packed_reader` (also replayed by `cargo test` in `fuzz/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::packed_reader(data));
