// Training BatchNorm + SiLU on CUDA: the kernels of norm/cuda.rs (compiled by NVRTC at run time). The activations
// are f32, or f16 / bf16 (mixed precision: half activations, f32 parameters and statistics); every element is
// computed in f32 and the sums in f64. Each kernel that touches activations exists once per element type, with
// the suffix `_f16` or `_bf16` for the half ones (half values travel as their 16 bits: no CUDA headers needed).

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float ld(float v) { return v; }
    static __device__ __forceinline__ float st(float v) { return v; }
};

struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float ld(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    static __device__ __forceinline__ unsigned short st(float f) {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
        return h;
    }
};

struct BF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float ld(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
    // Round to nearest even, as the `half` crate (and candle's casts) round; NaN stays a quiet NaN.
    static __device__ __forceinline__ unsigned short st(float f) {
        unsigned int u = __float_as_uint(f);
        if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (unsigned short)(u >> 16);
    }
};

template <class E>
__device__ void stats_partial(const typename E::T* x, double* part, int C, long long HW, long long M,
                              long long chunk, int S) {
    __shared__ double sa[256];
    __shared__ double sb[256];
    int c = blockIdx.x, s = blockIdx.y, t = threadIdx.x;
    long long j0 = (long long)s * chunk;
    long long j1 = j0 + chunk < M ? j0 + chunk : M;
    float k = E::ld(x[(long long)c * HW]);
    double a = 0.0, b = 0.0;
    for (long long j = j0 + t; j < j1; j += blockDim.x) {
        long long n = j / HW, i = j - n * HW;
        double d = (double)(E::ld(x[(n * C + c) * HW + i]) - k);
        a += d;
        b += d * d;
    }
    sa[t] = a;
    sb[t] = b;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (t < o) { sa[t] += sa[t + o]; sb[t] += sb[t + o]; }
        __syncthreads();
    }
    if (t == 0) { part[((long long)c * S + s) * 2] = sa[0]; part[((long long)c * S + s) * 2 + 1] = sb[0]; }
}

template <class E>
__device__ void stats_final(const typename E::T* x, const double* part, const float* gamma, const float* beta,
                            double eps, int C, long long HW, long long M, int S, double* saved, float* mv,
                            float* ab) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s1 = 0.0, s2 = 0.0;
    for (int s = 0; s < S; ++s) { s1 += part[((long long)c * S + s) * 2]; s2 += part[((long long)c * S + s) * 2 + 1]; }
    double d = s1 / (double)M;
    double mean = (double)E::ld(x[(long long)c * HW]) + d;
    double var = s2 / (double)M - d * d;
    if (var < 0.0) var = 0.0;
    double inv = 1.0 / sqrt(var + eps);
    double a = (double)gamma[c] * inv;
    saved[c] = mean; saved[C + c] = inv;
    mv[c] = (float)mean; mv[C + c] = (float)var;
    ab[c] = (float)a; ab[C + c] = (float)((double)beta[c] - mean * a);
}

template <class E>
__device__ void silu_apply(const typename E::T* x, const float* ab, typename E::T* y, int C, long long HW,
                           long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        int c = (int)((i / HW) % C);
        float z = E::ld(x[i]) * ab[c] + ab[C + c];
        y[i] = E::st(z / (1.0f + expf(-z)));
    }
}

__device__ __forceinline__ float dz_of(float x, float g, float a, float b) {
    float z = x * a + b;
    float s = 1.0f / (1.0f + expf(-z));
    return g * s * (1.0f + z * (1.0f - s));
}

template <class E>
__device__ void bwd_partial(const typename E::T* x, const typename E::T* g, const float* ab, const double* saved,
                            double* part, int C, long long HW, long long M, long long chunk, int S) {
    __shared__ double sa[256];
    __shared__ double sb[256];
    int c = blockIdx.x, s = blockIdx.y, t = threadIdx.x;
    long long j0 = (long long)s * chunk;
    long long j1 = j0 + chunk < M ? j0 + chunk : M;
    float a_ = ab[c], b_ = ab[C + c];
    float m = (float)saved[c];
    double a = 0.0, b = 0.0;
    for (long long j = j0 + t; j < j1; j += blockDim.x) {
        long long n = j / HW, i = j - n * HW;
        long long idx = (n * C + c) * HW + i;
        float xv = E::ld(x[idx]);
        float dz = dz_of(xv, E::ld(g[idx]), a_, b_);
        a += (double)dz;
        b += (double)(dz * (xv - m));
    }
    sa[t] = a;
    sb[t] = b;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (t < o) { sa[t] += sa[t + o]; sb[t] += sb[t + o]; }
        __syncthreads();
    }
    if (t == 0) { part[((long long)c * S + s) * 2] = sa[0]; part[((long long)c * S + s) * 2 + 1] = sb[0]; }
}

extern "C" __global__ void bn_bwd_final(const double* part, const float* gamma, const double* saved, int C, int S,
                                        long long M, float* dgb, float* coef) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s0 = 0.0, s1 = 0.0;
    for (int s = 0; s < S; ++s) { s0 += part[((long long)c * S + s) * 2]; s1 += part[((long long)c * S + s) * 2 + 1]; }
    double inv = saved[C + c];
    double sdzx = s1 * inv;
    dgb[c] = (float)sdzx;
    dgb[C + c] = (float)s0;
    double k = (double)gamma[c] * inv;
    coef[c] = (float)k;
    coef[C + c] = (float)(k * s0 / (double)M);
    coef[2 * C + c] = (float)(k * inv * sdzx / (double)M);
    coef[3 * C + c] = (float)saved[c];
}

template <class E>
__device__ void bwd_apply(const typename E::T* x, const typename E::T* g, const float* ab, const float* coef,
                          typename E::T* dx, int C, long long HW, long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        int c = (int)((i / HW) % C);
        float xv = E::ld(x[i]);
        float dz = dz_of(xv, E::ld(g[i]), ab[c], ab[C + c]);
        dx[i] = E::st(coef[c] * dz - coef[C + c] - coef[2 * C + c] * (xv - coef[3 * C + c]));
    }
}

// The entry points, one set per element type.
#define BN_KERNELS(E, SUFFIX)                                                                                       \
    extern "C" __global__ void bn_stats_partial##SUFFIX(const E::T* x, double* part, int C, long long HW,          \
                                                        long long M, long long chunk, int S) {                     \
        stats_partial<E>(x, part, C, HW, M, chunk, S);                                                              \
    }                                                                                                               \
    extern "C" __global__ void bn_stats_final##SUFFIX(const E::T* x, const double* part, const float* gamma,       \
                                                      const float* beta, double eps, int C, long long HW,          \
                                                      long long M, int S, double* saved, float* mv, float* ab) {   \
        stats_final<E>(x, part, gamma, beta, eps, C, HW, M, S, saved, mv, ab);                                      \
    }                                                                                                               \
    extern "C" __global__ void bn_silu_apply##SUFFIX(const E::T* x, const float* ab, E::T* y, int C, long long HW, \
                                                     long long total) {                                            \
        silu_apply<E>(x, ab, y, C, HW, total);                                                                      \
    }                                                                                                               \
    extern "C" __global__ void bn_bwd_partial##SUFFIX(const E::T* x, const E::T* g, const float* ab,               \
                                                      const double* saved, double* part, int C, long long HW,      \
                                                      long long M, long long chunk, int S) {                       \
        bwd_partial<E>(x, g, ab, saved, part, C, HW, M, chunk, S);                                                  \
    }                                                                                                               \
    extern "C" __global__ void bn_bwd_apply##SUFFIX(const E::T* x, const E::T* g, const float* ab,                 \
                                                    const float* coef, E::T* dx, int C, long long HW,              \
                                                    long long total) {                                             \
        bwd_apply<E>(x, g, ab, coef, dx, C, HW, total);                                                             \
    }

BN_KERNELS(F32, )
BN_KERNELS(F16, _f16)
BN_KERNELS(BF16, _bf16)
