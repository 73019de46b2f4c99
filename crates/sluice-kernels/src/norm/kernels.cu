// Training BatchNorm + SiLU on CUDA: the kernels of norm/cuda.rs (compiled by NVRTC at run time).
extern "C" __global__ void bn_stats_partial(const float* x, double* part, int C, long long HW, long long M,
                                            long long chunk, int S) {
    __shared__ double sa[256];
    __shared__ double sb[256];
    int c = blockIdx.x, s = blockIdx.y, t = threadIdx.x;
    long long j0 = (long long)s * chunk;
    long long j1 = j0 + chunk < M ? j0 + chunk : M;
    float k = x[(long long)c * HW];
    double a = 0.0, b = 0.0;
    for (long long j = j0 + t; j < j1; j += blockDim.x) {
        long long n = j / HW, i = j - n * HW;
        double d = (double)(x[(n * C + c) * HW + i] - k);
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

extern "C" __global__ void bn_stats_final(const float* x, const double* part, const float* gamma, const float* beta,
                                          double eps, int C, long long HW, long long M, int S, double* saved,
                                          float* mv, float* ab) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s1 = 0.0, s2 = 0.0;
    for (int s = 0; s < S; ++s) { s1 += part[((long long)c * S + s) * 2]; s2 += part[((long long)c * S + s) * 2 + 1]; }
    double d = s1 / (double)M;
    double mean = (double)x[(long long)c * HW] + d;
    double var = s2 / (double)M - d * d;
    if (var < 0.0) var = 0.0;
    double inv = 1.0 / sqrt(var + eps);
    double a = (double)gamma[c] * inv;
    saved[c] = mean; saved[C + c] = inv;
    mv[c] = (float)mean; mv[C + c] = (float)var;
    ab[c] = (float)a; ab[C + c] = (float)((double)beta[c] - mean * a);
}

extern "C" __global__ void bn_silu_apply(const float* x, const float* ab, float* y, int C, long long HW,
                                         long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        int c = (int)((i / HW) % C);
        float z = x[i] * ab[c] + ab[C + c];
        y[i] = z / (1.0f + expf(-z));
    }
}

__device__ __forceinline__ float dz_of(float x, float g, float a, float b) {
    float z = x * a + b;
    float s = 1.0f / (1.0f + expf(-z));
    return g * s * (1.0f + z * (1.0f - s));
}

extern "C" __global__ void bn_bwd_partial(const float* x, const float* g, const float* ab, const double* saved,
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
        float xv = x[idx];
        float dz = dz_of(xv, g[idx], a_, b_);
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

extern "C" __global__ void bn_bwd_apply(const float* x, const float* g, const float* ab, const float* coef, float* dx,
                                        int C, long long HW, long long total) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        int c = (int)((i / HW) % C);
        float xv = x[i];
        float dz = dz_of(xv, g[i], ab[c], ab[C + c]);
        dx[i] = coef[c] * dz - coef[C + c] - coef[2 * C + c] * (xv - coef[3 * C + c]);
    }
}
