//! libFuzzer entry point; the checks live in `sluice_fuzz::data_yaml` (also replayed by `cargo test` in `fuzz/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::data_yaml(data));
