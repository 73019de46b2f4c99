// CIoU of every (GT, prediction) pair of a batch, the task-aligned assigner's overlaps (iou.rs; compiled by NVRTC
// at run time). Each step is one IEEE f32 operation in the order of the composed candle ops it replaces
// (sluice-model's `ciou_parts` and `ops::atan`), with the `_rn` intrinsics so the compiler contracts nothing into a
// fused multiply-add: the values are those of the CPU twin, bit for bit.

// `v * mul + add` as candle's affine computes it on the CPU (two roundings).
__device__ __forceinline__ float aff(float v, float mul, float add) { return __fadd_rn(__fmul_rn(v, mul), add); }
// candle's `maximum` / `minimum` on the CPU.
__device__ __forceinline__ float mx(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float mn(float a, float b) { return a > b ? b : a; }

// Cephes atanf as sluice-model's `ops::atan` composes it. Constants are double literals cast to float, the one
// rounding Rust's `f64 as f32` makes.
__device__ float atan_c(float x) {
    const float tan_3pi_8 = (float)2.414213562373095;
    const float tan_pi_8 = (float)0.414213562373095;
    float a = fabsf(x);
    bool big = a > tan_3pi_8;
    bool mid = a > tan_pi_8;
    float a_big = big ? a : 1.0f;
    float t_big = -__fdiv_rn(1.0f, a_big);
    float t_mid = __fdiv_rn(aff(a, 1.0f, -1.0f), aff(a, 1.0f, 1.0f));
    float t = big ? t_big : (mid ? t_mid : a);
    float off = big ? (float)1.5707963267948966 : (mid ? (float)0.7853981633974483 : 0.0f);
    float z = __fmul_rn(t, t);
    float poly = aff(z, (float)8.05374449538e-2, 0.0f);
    poly = aff(poly, 1.0f, (float)-1.38776856032e-1);
    poly = __fmul_rn(poly, z);
    poly = aff(poly, 1.0f, (float)1.99777106478e-1);
    poly = __fmul_rn(poly, z);
    poly = aff(poly, 1.0f, (float)-3.33329491539e-1);
    float r = __fadd_rn(__fadd_rn(off, __fmul_rn(__fmul_rn(poly, z), t)), t);
    return __fmul_rn(r, x < 0.0f ? -1.0f : 1.0f);
}

// gt (B, M, 4) and pred (B, 4, A) x1 y1 x2 y2, both contiguous; out (B, M, A). `c` holds the constants as the
// composed ops convert them from f64: eps, 1 + eps, 4/pi^2.
extern "C" __global__ void sluice_ciou_pairs(const float* gt, const float* pred, float* out, unsigned int b,
                                             unsigned int m, unsigned int a, float eps, float one_eps,
                                             float four_pi2) {
    unsigned long long n = (unsigned long long)b * m * a;
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long ai = i % a;
        unsigned long long bm = i / a;
        unsigned long long bi = bm / m;
        const float* g = gt + bm * 4;
        const float* p = pred + bi * 4 * (unsigned long long)a + ai;
        float x1a = g[0], y1a = g[1], x2a = g[2], y2a = g[3];
        float x1b = p[0], y1b = p[a], x2b = p[2 * (unsigned long long)a], y2b = p[3 * (unsigned long long)a];
        float w1 = __fsub_rn(x2a, x1a);
        float h1 = mx(__fsub_rn(y2a, y1a), eps);
        float w2 = __fsub_rn(x2b, x1b);
        float h2 = mx(__fsub_rn(y2b, y1b), eps);
        float iw = mx(__fsub_rn(mn(x2a, x2b), mx(x1a, x1b)), 0.0f);
        float ih = mx(__fsub_rn(mn(y2a, y2b), mx(y1a, y1b)), 0.0f);
        float inter = __fmul_rn(iw, ih);
        float uni = aff(__fsub_rn(__fadd_rn(__fmul_rn(w1, h1), __fmul_rn(w2, h2)), inter), 1.0f, eps);
        float iou = __fdiv_rn(inter, uni);
        float cw = __fsub_rn(mx(x2a, x2b), mn(x1a, x1b));
        float ch = __fsub_rn(mx(y2a, y2b), mn(y1a, y1b));
        float c2 = aff(__fadd_rn(__fmul_rn(cw, cw), __fmul_rn(ch, ch)), 1.0f, eps);
        float dx = __fsub_rn(__fsub_rn(__fadd_rn(x1b, x2b), x1a), x2a);
        float dy = __fsub_rn(__fsub_rn(__fadd_rn(y1b, y2b), y1a), y2a);
        float rho2 = aff(__fadd_rn(__fmul_rn(dx, dx), __fmul_rn(dy, dy)), 0.25f, 0.0f);
        float dv = __fsub_rn(atan_c(__fdiv_rn(w2, h2)), atan_c(__fdiv_rn(w1, h1)));
        float v = aff(__fmul_rn(dv, dv), four_pi2, 0.0f);
        float alpha = __fdiv_rn(v, aff(__fsub_rn(v, iou), 1.0f, one_eps));
        out[i] = __fsub_rn(iou, __fadd_rn(__fdiv_rn(rho2, c2), __fmul_rn(v, alpha)));
    }
}
