//! The u8 → float conversion of a batch's pixels on a CUDA device (feature `cuda`), for `sluice-transfer`'s CUDA
//! transfer: `v · scale` in f32, or that rounded to nearest even for bf16, bit-identical to the host conversion of
//! `sluice_transfer::CpuTransfer` (its twin, which the transfer's tests hold to the reference on the CPU).

/// The CUDA source (compiled by NVRTC at run time; `cargo xtask kernels` compiles it in CI).
pub const CUDA_SOURCE: &str = include_str!("convert/kernels.cu");

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::Convert;
