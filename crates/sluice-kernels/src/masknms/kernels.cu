// Batched NMS by overlap bitmasks on the device: the kernels of sluice-eval's masknms.rs steps, whose host twins
// there are the reference. Float operations use the round-to-nearest intrinsics so that NVRTC contracts no
// multiply-add and every value equals the host's. Predictions are B images of (4 + nc) rows over A anchors, float32:
// value (row r, anchor a) of image b at pred[b * (4 + nc) * A + r * rs + a * as] (channels first: rs = A, as = 1;
// anchors first: rs = 1, as = 4 + nc). Counts, positions and flags are unsigned 32-bit.

typedef unsigned long long u64;

#define NO_CANDIDATE 0xffffffffffffffffull

// The u32 whose ascending order is the descending order of a finite float; -0.0 and 0.0 are equal.
__device__ __forceinline__ unsigned int desc_key(float s) {
    unsigned int b = __float_as_uint(__fadd_rn(s, 0.0f));
    unsigned int asc = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ~asc;
}

// Step 1: one thread per (image, anchor) writes the keys of the anchor's nc slots into keys[b * P + a * nc + c]
// (P: the padded segment length per image; slots past A * nc keep NO_CANDIDATE from the fill kernel), and flags an
// image with a non-finite box or score in bad[b].
extern "C" __global__ void masknms_candidate_keys(const float* pred, u64* keys, unsigned int* bad, int nc, long long A,
                                                  long long rs, long long as, long long P, int B, float conf,
                                                  int multi) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * A) return;
    long long b = t / A, a = t % A;
    const float* p = pred + b * (4 + nc) * A;
    u64* k = keys + b * P + a * nc;
    int finite = 1;
    for (int r = 0; r < 4; ++r) finite &= isfinite(p[r * rs + a * as]);
    int best = 0;
    float best_s = p[4 * rs + a * as];
    for (int c = 0; c < nc; ++c) {
        float s = p[(4 + c) * rs + a * as];
        finite &= isfinite(s);
        u64 key = NO_CANDIDATE;
        if (multi) {
            if (s > conf) key = ((u64)desc_key(s) << 32) | (u64)(a * nc + c);
        } else if (s > best_s) {
            best = c;
            best_s = s;
        }
        k[c] = key;
    }
    if (!multi && best_s > conf) k[best] = ((u64)desc_key(best_s) << 32) | (u64)(a * nc + best);
    if (!finite) atomicOr(bad + b, 1u);
}

// Fills n keys with NO_CANDIDATE (the padding of every segment).
extern "C" __global__ void masknms_fill(u64* keys, long long n) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < n) keys[t] = NO_CANDIDATE;
}

// Step 2a: the candidates of each image's P slots gathered into its C-key segment of `compact` (C a power of two,
// filled with NO_CANDIDATE before), in any order (the sort orders them; keys are distinct), and their number in
// found[b] (0 before). An image with more than C candidates keeps its full segment for the sort (overflow[b] = 1).
extern "C" __global__ void masknms_compact(const u64* keys, u64* compact, unsigned int* found, unsigned int* overflow,
                                           long long P, long long C, int B) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * P) return;
    long long b = t / P;
    u64 key = keys[t];
    if (key == NO_CANDIDATE) return;
    unsigned int pos = atomicAdd(found + b, 1u);
    if ((long long)pos < C) {
        compact[b * C + pos] = key;
    } else {
        overflow[b] = 1u;
    }
}

// After the sorts: an image that overflowed takes the first C keys of its sorted full segment (its candidates in
// order; the count keeps at most max_nms <= C of them).
extern "C" __global__ void masknms_take_full(const u64* keys, u64* compact, const unsigned int* overflow, long long P,
                                             long long C, int B) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * C) return;
    long long b = t / C, i = t % C;
    if (overflow[b]) compact[t] = keys[b * P + i];
}

// Step 2b: one compare-exchange pass (j, k) of an ascending bitonic sort of every image's segment of P keys (P a
// power of two), of the images whose select[b] is `want` (all of them when select is null). The keys are distinct,
// so the result is the host's sort.
extern "C" __global__ void masknms_bitonic_step(u64* keys, long long P, int B, long long j, long long k,
                                                const unsigned int* select, unsigned int want) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * P) return;
    long long b = t / P, i = t % P, l = i ^ j;
    if (select && select[b] != want) return;
    if (l <= i) return;
    u64* s = keys + b * P;
    u64 x = s[i], y = s[l];
    int up = (i & k) == 0;
    if ((up && x > y) || (!up && x < y)) {
        s[i] = y;
        s[l] = x;
    }
}

// The candidates NMS takes per image: all it found, at most max_nms.
extern "C" __global__ void masknms_count(const unsigned int* found, unsigned int* count, int B, long long max_nms) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= B) return;
    long long n = found[b];
    count[b] = (unsigned int)(n < max_nms ? n : max_nms);
}

// Step 3: for candidate i < count[b] of image b: the detection box, the suppression box and area (shifted by
// class * max_wh when offset != 0) and the group (the class when per_class). Rows of N per image.
extern "C" __global__ void masknms_boxes(const float* pred, const u64* keys, const unsigned int* count, float* boxes,
                                         float* sup, unsigned int* groups, int nc, long long A, long long rs,
                                         long long as, long long P, long long N, int B, float max_wh, int offset,
                                         int per_class) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * N) return;
    long long b = t / N, i = t % N;
    if (i >= (long long)count[b]) return;
    const float* p = pred + b * (4 + nc) * A;
    u64 slot = keys[b * P + i] & 0xffffffffull;
    long long a = (long long)(slot / (u64)nc);
    unsigned int c = (unsigned int)(slot % (u64)nc);
    float hw = __fdiv_rn(p[2 * rs + a * as], 2.0f), hh = __fdiv_rn(p[3 * rs + a * as], 2.0f);
    float cx = p[a * as], cy = p[rs + a * as];
    float bb[4] = {__fsub_rn(cx, hw), __fsub_rn(cy, hh), __fadd_rn(cx, hw), __fadd_rn(cy, hh)};
    float s[4] = {bb[0], bb[1], bb[2], bb[3]};
    if (offset) {
        float off = __fmul_rn((float)c, max_wh);
        for (int r = 0; r < 4; ++r) s[r] = __fadd_rn(s[r], off);
    }
    float area = __fmul_rn(__fsub_rn(s[2], s[0]), __fsub_rn(s[3], s[1]));
    float* ob = boxes + t * 4;
    float* os = sup + t * 5;
    for (int r = 0; r < 4; ++r) {
        ob[r] = bb[r];
        os[r] = s[r];
    }
    os[4] = area;
    groups[t] = per_class ? c : 0u;
}

// The float32 IoU of an earlier candidate k and a later one q, as the host computes it.
__device__ __forceinline__ float masknms_iou(const float* k, const float* q) {
    float w = fmaxf(__fsub_rn(fminf(k[2], q[2]), fmaxf(k[0], q[0])), 0.0f);
    float h = fmaxf(__fsub_rn(fminf(k[3], q[3]), fmaxf(k[1], q[1])), 0.0f);
    float inter = __fmul_rn(w, h);
    return __fdiv_rn(inter, __fsub_rn(__fadd_rn(k[4], q[4]), inter));
}

// Step 4 for image b: block (column block cb, row block rb) of 64 threads writes word cb of rows rb * 64 + x:
// bit y is set when candidate j = cb * 64 + y comes after i, shares its group and overlaps it by more than thr.
extern "C" __global__ void masknms_overlap(const float* sup, const unsigned int* groups, const unsigned int* count,
                                           u64* masks, long long N, int words, int b, double thr) {
    int n = (int)count[b];
    int rb = blockIdx.y, cb = blockIdx.x;
    if (cb < rb || rb * 64 >= n) return;
    __shared__ float cs[64 * 5];
    __shared__ unsigned int cg[64];
    const float* s = sup + (long long)b * N * 5;
    const unsigned int* g = groups + (long long)b * N;
    int j = cb * 64 + threadIdx.x;
    if (j < n) {
        for (int r = 0; r < 5; ++r) cs[threadIdx.x * 5 + r] = s[(long long)j * 5 + r];
        cg[threadIdx.x] = g[j];
    }
    __syncthreads();
    int i = rb * 64 + threadIdx.x;
    if (i >= n) return;
    const float* si = s + (long long)i * 5;
    unsigned int gi = g[i];
    u64 bits = 0;
    int cols = n - cb * 64 < 64 ? n - cb * 64 : 64;
    for (int y = (rb == cb ? threadIdx.x + 1 : 0); y < cols; ++y) {
        if (cg[y] == gi && (double)masknms_iou(si, cs + y * 5) > thr) bits |= 1ull << y;
    }
    masks[(long long)i * words + cb] = bits;
}

// Step 5 for image b, one block: greedy keep over the masks; the removed set lives in dynamic shared memory
// (words u64). Writes the kept positions to keep[b * max_det ...] and their number to kept[b].
extern "C" __global__ void masknms_keep(const u64* masks, const unsigned int* count, unsigned int* keep,
                                        unsigned int* kept, int words, int b, int max_det, int suppress) {
    extern __shared__ u64 removed[];
    __shared__ int nk;
    int n = (int)count[b];
    for (int w = threadIdx.x; w < words; w += blockDim.x) removed[w] = 0;
    if (threadIdx.x == 0) nk = 0;
    __syncthreads();
    for (int i = 0; i < n; ++i) {
        if (nk >= max_det) break;
        if ((removed[i >> 6] >> (i & 63)) & 1ull) continue;
        if (threadIdx.x == 0) keep[(long long)b * max_det + nk] = (unsigned int)i;
        if (suppress) {
            const u64* row = masks + (long long)i * words;
            for (int w = (i >> 6) + threadIdx.x; w < words; w += blockDim.x) removed[w] |= row[w];
        }
        __syncthreads();
        if (threadIdx.x == 0) nk += 1;
        __syncthreads();
    }
    if (threadIdx.x == 0) kept[b] = (unsigned int)nk;
}

// The kept rows of every image: out[(b * max_det + r) * 6] = x1, y1, x2, y2, score, class for r < kept[b], and the
// anchor of each in anchors[b * max_det + r]; the rest of the rows is left as it is.
extern "C" __global__ void masknms_gather(const float* pred, const u64* keys, const float* boxes,
                                          const unsigned int* keep, const unsigned int* kept, float* out,
                                          unsigned int* anchors, int nc, long long A, long long rs, long long as,
                                          long long P, long long N, int B, int max_det) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)B * max_det) return;
    long long b = t / max_det, r = t % max_det;
    if (r >= (long long)kept[b]) return;
    long long i = keep[t];
    u64 slot = keys[b * P + i] & 0xffffffffull;
    long long a = (long long)(slot / (u64)nc);
    long long c = (long long)(slot % (u64)nc);
    const float* bb = boxes + (b * N + i) * 4;
    float* o = out + t * 6;
    for (int k = 0; k < 4; ++k) o[k] = bb[k];
    o[4] = pred[b * (4 + nc) * A + (4 + c) * rs + a * as];
    o[5] = (float)c;
    anchors[t] = (unsigned int)a;
}
