//! Training-mode BatchNorm fused with SiLU: one pass forward, one pass backward, as a candle custom op.
