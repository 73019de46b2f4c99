// The class loss's sum of BCE with logits against one-hot targets, for a caller holding p = sigmoid(x)
// (loss.rs; compiled by NVRTC at run time): the value
//   sum over (b, c, a) of max(x, 0) - ln max(p, 1 - p), minus sum over (b, a) of w * x[b, label, a]
// in two launches (block partial sums in double, then their sum in a fixed order: the same bits every run), and
// the gradient g * (p - z) in one. `label` and `weight` hold each anchor's class and target score, B * A.

#define BCE_THREADS 256

// The sum of every thread's `v` over the block, in a fixed tree order (the same bits every run).
__device__ double block_sum(double* acc, double v) {
    acc[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int h = BCE_THREADS / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            acc[threadIdx.x] += acc[threadIdx.x + h];
        }
        __syncthreads();
    }
    return acc[0];
}

extern "C" __global__ void sluice_bce_onehot_partial(const float* x, const float* p, const unsigned int* label,
                                                     const float* weight, double* partial, unsigned int b,
                                                     unsigned int c, unsigned int a) {
    __shared__ double acc[BCE_THREADS];
    unsigned long long n = (unsigned long long)b * c * a;
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    double s = 0.0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long ai = i % a;
        unsigned long long ci = (i / a) % c;
        unsigned long long bi = i / ((unsigned long long)a * c);
        float xi = x[i];
        float pi = p[i];
        float q = 1.0f - pi;
        double t = (double)(xi > 0.0f ? xi : 0.0f) - (double)logf(pi > q ? pi : q);
        unsigned long long anchor = bi * a + ai;
        if ((unsigned long long)label[anchor] == ci) {
            t -= (double)weight[anchor] * (double)xi;
        }
        s += t;
    }
    double total = block_sum(acc, s);
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = total;
    }
}

// One block: the partial sums in a fixed order, the total as f32.
extern "C" __global__ void sluice_bce_onehot_final(const double* partial, float* out, unsigned int blocks) {
    __shared__ double acc[BCE_THREADS];
    double s = 0.0;
    for (unsigned int i = threadIdx.x; i < blocks; i += BCE_THREADS) {
        s += partial[i];
    }
    double total = block_sum(acc, s);
    if (threadIdx.x == 0) {
        out[0] = (float)total;
    }
}

// dx = g * (p - z), z the anchor's weight at its label and 0 elsewhere; g is the scalar upstream gradient.
extern "C" __global__ void sluice_bce_onehot_grad(const float* p, const unsigned int* label, const float* weight,
                                                  const float* g, float* dx, unsigned int b, unsigned int c,
                                                  unsigned int a) {
    unsigned long long n = (unsigned long long)b * c * a;
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    float gv = g[0];
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned long long ai = i % a;
        unsigned long long ci = (i / a) % c;
        unsigned long long bi = i / ((unsigned long long)a * c);
        unsigned long long anchor = bi * a + ai;
        float z = (unsigned long long)label[anchor] == ci ? weight[anchor] : 0.0f;
        dx[i] = gv * (p[i] - z);
    }
}
