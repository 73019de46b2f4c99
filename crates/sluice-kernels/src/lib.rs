//! Fast CPU training kernels for the YOLO model, as candle custom ops with forward *and* backward passes:
//! convolution through im2col/col2im + `gemm` ([`conv`]), training-mode BatchNorm fused with SiLU ([`norm`]),
//! the max-pool / nearest-upsample the model needs with correct gradients ([`pool`]), and the head's DFL box decode
//! ([`dfl`]) and the class loss's element-wise BCE with logits ([`loss`]); the assigner's CIoU of every
//! (GT, prediction) pair in one pass ([`iou`]); the SGD update as one parallel pass
//! ([`optim`]); the whole optimizer step (norm, clip, update, EMA) over every tensor at once ([`multi_tensor`]);
//! the chunked top-k of a tensor's rows on its own device ([`topk`]); and batched NMS by overlap bitmasks on a CUDA
//! device ([`masknms`]). With `cuda`, `nvrtc` compiles every CUDA source of the workspace once per device.
//!
//! [`threads`] holds the thread policy (rayon's global pool for the kernels and matmuls; candle's own
//! element-wise pool tamed on small machines), [`memory`] the allocator policy (mimalloc, freed memory kept).
//!
//! Every op is checked against candle's stock ops and against f64 central differences in its tests.
#![warn(missing_docs)]

pub mod conv;
pub mod convert;
pub mod depthwise;
pub mod dfl;
pub mod iou;
pub mod ledger;
pub mod loss;
pub mod masknms;
pub mod memory;
pub mod multi_tensor;
pub mod norm;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod optim;
pub mod pool;
pub mod threads;
pub mod topk;
mod uninit;
