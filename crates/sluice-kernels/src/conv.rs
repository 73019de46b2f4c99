//! Conv2d forward, input gradient and weight gradient as candle custom ops (im2col/col2im + gemm).
