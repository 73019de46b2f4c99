// The optimizer step over every parameter in a handful of launches (see multi_tensor/mod.rs). Tensors are passed
// as tables of device addresses (f32, contiguous) and lengths; grid.y is the tensor, grid.x strides over it. Every
// operation is written with explicit rounding (__fmul_rn, __fadd_rn, __fdiv_rn, fmaf where candle's affine
// contracts `x * mul + add` into one FMA), so the result is the composed candle ops' on the device.

#define CHUNKS 64

// The sum of every thread's `s` over the block (256 threads), valid in thread 0.
__device__ double block_sum(double s) {
    __shared__ double sh[256];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) sh[threadIdx.x] += sh[threadIdx.x + k];
        __syncthreads();
    }
    return sh[0];
}

// Per tensor and chunk, the sum of squares in f64 (no atomics: `part` is tensors × CHUNKS).
extern "C" __global__ void mt_sumsq(const unsigned long long* ptrs, const long long* lens, double* part) {
    const int t = blockIdx.y;
    const float* g = (const float*)ptrs[t];
    const long long n = lens[t];
    double s = 0.0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        double v = (double)g[i];
        s += v * v;
    }
    double total = block_sum(s);
    if (threadIdx.x == 0) part[(long long)t * CHUNKS + blockIdx.x] = total;
}

// One block: torch's `clip_grad_norm_` total (the norm of the per-tensor f32 norms) of the unscaled gradients, and
// `out = [total, clip coefficient, finite ? 1 : 0, 1 / scale]`. `scale` is the loss scale (null: none).
extern "C" __global__ void mt_norm_final(const double* part, int tensors, const float* scale, float max_norm,
                                         float* out) {
    const float inv = scale ? (float)(1.0 / (double)scale[0]) : 1.0f;
    double s = 0.0;
    for (int t = threadIdx.x; t < tensors; t += blockDim.x) {
        double sum = 0.0;
        for (int c = 0; c < CHUNKS; c++) sum += part[(long long)t * CHUNKS + c];
        // The per-tensor norm in f32, of the unscaled gradient (the scale is a power of two: exact).
        float nt = __fmul_rn(sqrtf((float)sum), inv);
        s += (double)nt * (double)nt;
    }
    double sum = block_sum(s);
    if (threadIdx.x == 0) {
        float total = sqrtf((float)sum);
        float coef = fminf(__fdiv_rn(max_norm, __fadd_rn(total, 1e-6f)), 1.0f);
        out[0] = total;
        out[1] = coef;
        out[2] = isfinite(total) ? 1.0f : 0.0f;
        out[3] = inv;
    }
}

// The update of every parameter where out[2] (finite) is 1. Per tensor, `c` holds 8 constants (see
// `multi_tensor::consts`). rule 0: SGD with Nesterov momentum; 1: Adam; 2: AdamW.
extern "C" __global__ void mt_update(int rule, const unsigned long long* P, const unsigned long long* G,
                                     const unsigned long long* B0, const unsigned long long* B1,
                                     const long long* lens, const float* consts, const float* out) {
    if (out[2] == 0.0f) return;
    const int t = blockIdx.y;
    float* p = (float*)P[t];
    const float* g = (const float*)G[t];
    float* b0 = (float*)B0[t];
    float* b1 = (float*)B1[t];
    const long long n = lens[t];
    const float* c = consts + 8 * (long long)t;
    const float coef = out[1], inv = out[3];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float gi = __fmul_rn(__fmul_rn(g[i], inv), coef);
        float pi = p[i];
        if (rule == 0) {
            // c = [wd, momentum, -lr, has_wd, has_momentum]
            float d = c[3] != 0.0f ? __fadd_rn(gi, __fmul_rn(pi, c[0])) : gi;
            if (c[4] != 0.0f) {
                float buf = __fadd_rn(__fmul_rn(b0[i], c[1]), d);
                b0[i] = buf;
                d = __fadd_rn(d, __fmul_rn(buf, c[1]));
            }
            p[i] = __fadd_rn(pi, __fmul_rn(d, c[2]));
        } else {
            // c = [wd, 1 - beta1, 1 - beta2, beta2, 1/sqrt(bc2), eps, -lr/bc1, 1 - lr*wd]; c[0] = 0: no decay
            if (c[0] != 0.0f) {
                if (rule == 2) pi = __fmul_rn(pi, c[7]);
                else gi = __fadd_rn(gi, __fmul_rn(p[i], c[0]));
            }
            float m = __fadd_rn(b0[i], __fmul_rn(__fsub_rn(gi, b0[i]), c[1]));
            float v = __fadd_rn(__fmul_rn(b1[i], c[3]), __fmul_rn(__fmul_rn(gi, gi), c[2]));
            float denom = fmaf(sqrtf(v), c[4], c[5]);
            b0[i] = m;
            b1[i] = v;
            p[i] = __fadd_rn(pi, __fmul_rn(__fdiv_rn(m, denom), c[6]));
        }
    }
}

// The EMA of every variable: torch's `lerp_(model, w)` with its two branches (`small`: |w| < 0.5), where `ok` is
// null or out[2] is 1.
extern "C" __global__ void mt_ema(const unsigned long long* E, const unsigned long long* M, const long long* lens,
                                  float w, float w_minus_1, int small, const float* ok) {
    if (ok && ok[2] == 0.0f) return;
    const int t = blockIdx.y;
    float* e = (float*)E[t];
    const float* m = (const float*)M[t];
    const long long n = lens[t];
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        float diff = __fsub_rn(m[i], e[i]);
        e[i] = small ? __fadd_rn(e[i], __fmul_rn(diff, w)) : __fadd_rn(m[i], __fmul_rn(diff, w_minus_1));
    }
}
