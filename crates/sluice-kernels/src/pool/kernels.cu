// SPPF's max-pool (stride 1, same padding, -inf outside the plane) as the index of each window's first maximum
// in raster order (pool.rs: the output is then gathered from the input there, so the backward is the gather's one
// scatter-add). The index is the one `max_pool2d_same_gather`'s composed search finds, clamped into the plane the
// same way. Half values travel as their 16 bits (no CUDA headers needed); comparisons are exact in f32.

struct F32 {
    typedef float T;
    static __device__ __forceinline__ float ld(float v) { return v; }
};

struct F16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float ld(unsigned short h) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
};

struct BF16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float ld(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
};

template <class E>
__device__ void pool_argmax(const typename E::T* x, unsigned int* idx, unsigned long long planes, unsigned int h,
                            unsigned int w, unsigned int k) {
    unsigned long long hw = (unsigned long long)h * w;
    unsigned long long n = planes * hw;
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    int p = (int)(k / 2);
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const typename E::T* plane = x + (i / hw) * hw;
        int oy = (int)((i % hw) / w);
        int ox = (int)((i % hw) % w);
        // The window's top-left position (padded) first, then strictly greater values in raster order.
        int by = oy - p, bx = ox - p;
        float best = (by >= 0 && bx >= 0) ? E::ld(plane[(unsigned long long)by * w + bx]) : -INFINITY;
        for (int dy = 0; dy < (int)k; ++dy) {
            int y = oy - p + dy;
            for (int dx = 0; dx < (int)k; ++dx) {
                int xx = ox - p + dx;
                float v = (y >= 0 && y < (int)h && xx >= 0 && xx < (int)w) ? E::ld(plane[(unsigned long long)y * w + xx])
                                                                          : -INFINITY;
                if (v > best) {
                    best = v;
                    by = y;
                    bx = xx;
                }
            }
        }
        by = by < 0 ? 0 : (by > (int)h - 1 ? (int)h - 1 : by);
        bx = bx < 0 ? 0 : (bx > (int)w - 1 ? (int)w - 1 : bx);
        idx[i] = (unsigned int)by * w + (unsigned int)bx;
    }
}

#define POOL_KERNEL(E, SUFFIX)                                                                                   \
    extern "C" __global__ void sluice_pool_argmax##SUFFIX(const E::T* x, unsigned int* idx,                     \
                                                           unsigned long long planes, unsigned int h,            \
                                                           unsigned int w, unsigned int k) {                     \
        pool_argmax<E>(x, idx, planes, h, w, k);                                                                  \
    }

POOL_KERNEL(F32, _f32)
POOL_KERNEL(F16, _f16)
POOL_KERNEL(BF16, _bf16)
