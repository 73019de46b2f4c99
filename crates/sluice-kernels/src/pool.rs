//! Max-pool (stride 1, same padding) and nearest ×2 upsample with correct, accumulating gradients.
