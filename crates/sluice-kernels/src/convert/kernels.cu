// The u8 → float conversion of a batch's pixels (convert.rs; compiled by NVRTC at run time).
extern "C" __global__ void sluice_u8_to_f32(const unsigned char* src, float* dst, unsigned long long n, float scale) {
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        dst[i] = (float)src[i] * scale;
    }
}
extern "C" __global__ void sluice_u8_to_bf16(const unsigned char* src, unsigned short* dst, unsigned long long n, float scale) {
    unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        unsigned int b = __float_as_uint((float)src[i] * scale);
        b += 0x7fffu + ((b >> 16) & 1u);
        dst[i] = (unsigned short)(b >> 16);
    }
}
