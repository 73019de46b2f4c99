//! libFuzzer entry point; the checks live in `sluice_fuzz::pt_checkpoint` (also replayed by `cargo test` in `fuzz/`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::pt_checkpoint(data));
