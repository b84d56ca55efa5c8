// ggml weight block formats on the device (prepended after common.cuh to
// the sources that read weights: embed.cu, matmul.cu; iq2.cuh follows it
// with IQ2_XXS).
//
// Every format is read in chunks of 32 consecutive values: a legacy block
// (Q4_0, Q4_1, Q5_0, Q8_0) is one chunk; a K-quant super-block of 256 is
// NSUB = 8 chunks; F32 and F16 rows are cut into 32-value pseudo-blocks.
// Per format:
//   deq(block, sub, y[32])   dequantize chunk `sub` exactly like the CPU
//                            reference (kernels/src/quant/*.rs); products
//                            and sums use __fmul_rn/__fadd_rn so that no
//                            FMA contraction changes the rounding;
//   word(block, sub, i)      integer quants i*4 .. i*4+3 of the chunk
//                            packed 4 per int (for dp4a and int8 mma),
//                            read as one 4-byte word (two 2-byte halves
//                            for formats whose block size is not a
//                            multiple of 4; a weight's base address must
//                            be 4-byte aligned);
//   scales(block, sub, s0, s1, m)
//                            the integer scales of the chunk's two
//                            16-value halves, and its integer min scale;
//   hdr(block)               the block's f16 scale(s) combine_h reads,
//                            as one word (low half first);
//   combine_h(hdr, isum, summs, ad, as)
//                            the block's float contribution from the
//                            integer sums of all its chunks (the CPU's
//                            formula, same operation order); combine<T>
//                            reads the word from the block.
// ACT names the activation format: 0 = Q8_0, 1 = Q8_1, 2 = Q8_K.

// 4 bytes at a 2-byte (ld32_2) or 4-byte (ld32_4) aligned address.
__device__ __forceinline__ u32 ld32_2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}
__device__ __forceinline__ u32 ld32_4(const u8* p) { return *(const u32*)p; }
// ld32_2 from the two aligned words around p (one 32-bit load per word
// instead of two 16-bit ones; consecutive words share a load). Reads up to
// 4 bytes past p + 4: only where the block holds them.
__device__ __forceinline__ u32 ld32_2w(const u8* p) {
    const u32* a = (const u32*)((u64)p & ~(u64)3);
    return __funnelshift_r(a[0], a[1], ((u32)(u64)p & 3) * 8);
}

// The low and high f16 of a word.
__device__ __forceinline__ float lo_h(u32 h) { return h2f((u16)(h & 0xffff)); }
__device__ __forceinline__ float hi_h(u32 h) { return h2f((u16)(h >> 16)); }

struct TF32 {
    static constexpr int NSUB = 1, BYTES = 128, ACT = -1;
    static __device__ __forceinline__ void deq(const u8* b, int, float* y) {
        const float* f = (const float*)b;
#pragma unroll
        for (int i = 0; i < 32; i++) y[i] = f[i];
    }
};

struct TF16 {
    static constexpr int NSUB = 1, BYTES = 64, ACT = -1;
    static __device__ __forceinline__ void deq(const u8* b, int, float* y) {
        const u16* h = (const u16*)b;
#pragma unroll
        for (int i = 0; i < 32; i++) y[i] = h2f(h[i]);
    }
};

struct TQ4_0 {
    static __device__ __forceinline__ int word(const u8* b, int, int i) {
        u32 w = ld32_2(b + 2 + 4 * (i & 3));
        return (int)__vsubss4((i < 4 ? w : w >> 4) & 0x0f0f0f0fu, 0x08080808u);
    }
    static __device__ __forceinline__ void scales(const u8*, int, int& s0, int& s1, int& m) { s0 = 1; s1 = 1; m = 0; }
    static constexpr int NSUB = 1, BYTES = 18, ACT = 0;
    static __device__ __forceinline__ void deq(const u8* b, int, float* y) {
        float d = ld_h(b);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[2 + j];
            y[j] = __fmul_rn((float)((q & 15) - 8), d);
            y[j + 16] = __fmul_rn((float)((q >> 4) - 8), d);
        }
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_2(b); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int, float ad, float) {
        return (float)isum * (lo_h(h) * ad);
    }
};

struct TQ4_1 {
    static __device__ __forceinline__ int word(const u8* b, int, int i) {
        u32 w = ld32_4(b + 4 + 4 * (i & 3));
        return (int)((i < 4 ? w : w >> 4) & 0x0f0f0f0fu);
    }
    static __device__ __forceinline__ void scales(const u8*, int, int& s0, int& s1, int& m) { s0 = 1; s1 = 1; m = 0; }
    static constexpr int NSUB = 1, BYTES = 20, ACT = 1;
    static __device__ __forceinline__ void deq(const u8* b, int, float* y) {
        float d = ld_h(b), mn = ld_h(b + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int q = b[4 + j];
            y[j] = __fadd_rn(__fmul_rn((float)(q & 15), d), mn);
            y[j + 16] = __fadd_rn(__fmul_rn((float)(q >> 4), d), mn);
        }
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_2(b); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int, float ad, float as) {
        return __fadd_rn(__fmul_rn(lo_h(h) * ad, (float)isum), __fmul_rn(hi_h(h), as));
    }
};

struct TQ5_0 {
    static __device__ __forceinline__ int word(const u8* b, int, int i) {
        u32 qh = ld32_2(b + 2);
        u32 w = ld32_2(b + 6 + 4 * (i & 3));
        int base = (i < 4 ? 0 : 16) + 4 * (i & 3);
        u32 h = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) h |= ((qh >> (base + k)) & 1u) << (8 * k + 4);
        return (int)__vsubss4(((i < 4 ? w : w >> 4) & 0x0f0f0f0fu) | h, 0x10101010u);
    }
    static __device__ __forceinline__ void scales(const u8*, int, int& s0, int& s1, int& m) { s0 = 1; s1 = 1; m = 0; }
    static constexpr int NSUB = 1, BYTES = 22, ACT = 0;
    static __device__ __forceinline__ void vals(const u8* b, int* v) {
        u32 qh = (u32)b[2] | ((u32)b[3] << 8) | ((u32)b[4] << 16) | ((u32)b[5] << 24);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int x = b[6 + j];
            v[j] = ((x & 15) | (((qh >> j) & 1) << 4)) - 16;
            v[j + 16] = ((x >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        }
    }
    static __device__ __forceinline__ void deq(const u8* b, int, float* y) {
        float d = ld_h(b);
        int v[32];
        vals(b, v);
#pragma unroll
        for (int j = 0; j < 32; j++) y[j] = __fmul_rn((float)v[j], d);
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_2(b); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int, float ad, float) {
        return (lo_h(h) * ad) * (float)isum;
    }
};

struct TQ8_0 {
    static __device__ __forceinline__ int word(const u8* b, int, int i) { return (int)ld32_2(b + 2 + 4 * i); }
    static __device__ __forceinline__ void scales(const u8*, int, int& s0, int& s1, int& m) { s0 = 1; s1 = 1; m = 0; }
    static constexpr int NSUB = 1, BYTES = 34, ACT = 0;
    static __device__ __forceinline__ void deq(const u8* b, int, float* y) {
        float d = ld_h(b);
#pragma unroll
        for (int j = 0; j < 32; j++) y[j] = __fmul_rn((float)(i8)b[2 + j], d);
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_2(b); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int, float ad, float) {
        return (float)isum * (lo_h(h) * ad);
    }
};

// Q4_K / Q5_K 6-bit scale and min of sub-block j (k4_scales_mins).
__device__ __forceinline__ void k4_scale_min(const u8* s, int j, int& sc, int& mn) {
    if (j < 4) {
        sc = s[j] & 63;
        mn = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

struct TQ4_K {
    static __device__ __forceinline__ int word(const u8* b, int sub, int i) {
        return (int)((ld32_4(b + 16 + 32 * (sub >> 1) + 4 * i) >> (4 * (sub & 1))) & 0x0f0f0f0fu);
    }
    static __device__ __forceinline__ void scales(const u8* b, int sub, int& s0, int& s1, int& m) {
        int sc, mn;
        k4_scale_min(b + 4, sub, sc, mn);
        s0 = sc; s1 = sc; m = mn;
    }
    static constexpr int NSUB = 8, BYTES = 144, ACT = 2;
    static __device__ __forceinline__ void vals(const u8* b, int sub, int* v) {
        const u8* qs = b + 16 + 32 * (sub >> 1);
        int sh = 4 * (sub & 1);
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = (qs[i] >> sh) & 15;
    }
    static __device__ __forceinline__ void deq(const u8* b, int sub, float* y) {
        int sc, mn;
        k4_scale_min(b + 4, sub, sc, mn);
        float d1 = ld_h(b) * (float)sc, m1 = ld_h(b + 2) * (float)mn;
        int v[32];
        vals(b, sub, v);
#pragma unroll
        for (int i = 0; i < 32; i++) y[i] = __fsub_rn(__fmul_rn(d1, (float)v[i]), m1);
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_4(b); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int summs, float ad, float) {
        return __fsub_rn(__fmul_rn(lo_h(h) * ad, (float)isum), __fmul_rn(hi_h(h) * ad, (float)summs));
    }
};

struct TQ5_K {
    static __device__ __forceinline__ int word(const u8* b, int sub, int i) {
        u32 lo = (ld32_4(b + 48 + 32 * (sub >> 1) + 4 * i) >> (4 * (sub & 1))) & 0x0f0f0f0fu;
        u32 hi = ((ld32_4(b + 16 + 4 * i) >> sub) & 0x01010101u) << 4;
        return (int)(lo | hi);
    }
    static __device__ __forceinline__ void scales(const u8* b, int sub, int& s0, int& s1, int& m) {
        int sc, mn;
        k4_scale_min(b + 4, sub, sc, mn);
        s0 = sc; s1 = sc; m = mn;
    }
    static constexpr int NSUB = 8, BYTES = 176, ACT = 2;
    static __device__ __forceinline__ void vals(const u8* b, int sub, int* v) {
        const u8* qh = b + 16;
        const u8* qs = b + 48 + 32 * (sub >> 1);
        int sh = 4 * (sub & 1);
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = ((qs[i] >> sh) & 15) + (((qh[i] >> sub) & 1) << 4);
    }
    static __device__ __forceinline__ void deq(const u8* b, int sub, float* y) {
        int sc, mn;
        k4_scale_min(b + 4, sub, sc, mn);
        float d1 = ld_h(b) * (float)sc, m1 = ld_h(b + 2) * (float)mn;
        int v[32];
        vals(b, sub, v);
#pragma unroll
        for (int i = 0; i < 32; i++) y[i] = __fsub_rn(__fmul_rn(d1, (float)v[i]), m1);
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_4(b); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int summs, float ad, float) {
        return TQ4_K::combine_h(h, isum, summs, ad, 0.0f);
    }
};

struct TQ6_K {
    static __device__ __forceinline__ int word(const u8* b, int sub, int i) {
        int h = sub >> 2, r = sub & 3;
        // ql and qh end at byte 192 of the 210: ld32_2w stays in the block.
        u32 lo = (ld32_2w(b + 64 * h + 32 * (r & 1) + 4 * i) >> (r < 2 ? 0 : 4)) & 0x0f0f0f0fu;
        u32 hi = ((ld32_2w(b + 128 + 32 * h + 4 * i) >> (2 * r)) & 0x03030303u) << 4;
        return (int)__vsubss4(lo | hi, 0x20202020u);
    }
    static __device__ __forceinline__ void scales(const u8* b, int sub, int& s0, int& s1, int& m) {
        s0 = (i8)b[192 + 2 * sub];
        s1 = (i8)b[193 + 2 * sub];
        m = 0;
    }
    static constexpr int NSUB = 8, BYTES = 210, ACT = 2;
    static __device__ __forceinline__ void vals(const u8* b, int sub, int* v) {
        int h = sub >> 2, r = sub & 3;
        const u8* ql = b + 64 * h + 32 * (r & 1);
        const u8* qh = b + 128 + 32 * h;
        int sh = r < 2 ? 0 : 4;
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = (((ql[i] >> sh) & 15) | (((qh[i] >> (2 * r)) & 3) << 4)) - 32;
    }
    static __device__ __forceinline__ void deq(const u8* b, int sub, float* y) {
        float d = ld_h(b + 208);
        float dl0 = d * (float)(i8)b[192 + 2 * sub], dl1 = d * (float)(i8)b[193 + 2 * sub];
        int v[32];
        vals(b, sub, v);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            y[i] = __fmul_rn(dl0, (float)v[i]);
            y[i + 16] = __fmul_rn(dl1, (float)v[i + 16]);
        }
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return *(const u16*)(b + 208); }
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int, float ad, float) {
        return lo_h(h) * ad * (float)isum;
    }
};

// Q2_K: 16 scale bytes (low nibble: scale, high nibble: min, one per 16
// values) | 64 bytes of 2-bit quants | d | dmin. Chunk sub takes the
// 2-bit field at shift 2 (sub % 4) of quant bytes 32 (sub / 4) .. + 31.
// scales() packs the chunk's two mins as m0 | m1 << 8 (Min16 below).
struct TQ2_K {
    static __device__ __forceinline__ int word(const u8* b, int sub, int i) {
        return (int)((ld32_4(b + 16 + 32 * (sub >> 2) + 4 * i) >> (2 * (sub & 3))) & 0x03030303u);
    }
    static __device__ __forceinline__ void scales(const u8* b, int sub, int& s0, int& s1, int& m) {
        int a = b[2 * sub], c = b[2 * sub + 1];
        s0 = a & 15;
        s1 = c & 15;
        m = (a >> 4) | ((c >> 4) << 8);
    }
    static constexpr int NSUB = 8, BYTES = 84, ACT = 2;
    static __device__ __forceinline__ void deq(const u8* b, int sub, float* y) {
        float d = ld_h(b + 80), dmin = ld_h(b + 82);
        const u8* qs = b + 16 + 32 * (sub >> 2);
        int sh = 2 * (sub & 3);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int sc = b[2 * sub + h];
            float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
#pragma unroll
            for (int i = 0; i < 16; i++)
                y[16 * h + i] = __fsub_rn(__fmul_rn(dl, (float)((qs[16 * h + i] >> sh) & 3)), ml);
        }
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return ld32_4(b + 80); }
    // ggml: dy * d * isum - dy * dmin * summs.
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int summs, float ad, float) {
        return __fsub_rn(__fmul_rn(ad * lo_h(h), (float)isum), __fmul_rn(ad * hi_h(h), (float)summs));
    }
};

// Formats with a min term (summs: min scales x the Q8_K activation's
// 16-value sums), and those with a min per 16 values rather than per
// chunk (scales() packs the chunk's two as m0 | m1 << 8).
template <class T> struct HasMin { static constexpr bool v = false; };
template <> struct HasMin<TQ4_K> { static constexpr bool v = true; };
template <> struct HasMin<TQ5_K> { static constexpr bool v = true; };
template <> struct HasMin<TQ2_K> { static constexpr bool v = true; };
template <class T> struct Min16 { static constexpr bool v = false; };
template <> struct Min16<TQ2_K> { static constexpr bool v = true; };

// The min term of a chunk: its min scale(s) m (as scales() gives them)
// times its two 16-value activation sums bs0, bs1.
template <class T>
__device__ __forceinline__ int chunk_min_term(int m, int bs0, int bs1) {
    return Min16<T>::v ? (m & 255) * bs0 + (m >> 8) * bs1 : m * (bs0 + bs1);
}

template <class T>
__device__ __forceinline__ float combine(const u8* b, int isum, int summs, float ad, float as) {
    return T::combine_h(T::hdr(b), isum, summs, ad, as);
}

// All 8 words and the scales of one chunk.
template <class T>
__device__ __forceinline__ void load_chunk(const u8* b, int sub, int* q, int& s0, int& s1, int& m) {
#pragma unroll
    for (int i = 0; i < 8; i++) q[i] = T::word(b, sub, i);
    T::scales(b, sub, s0, s1, m);
}

// ---- activation quantization ---------------------------------------------
//
// One warp quantizes 256 consecutive values of a row-major [rows, cols]
// activation starting at flat index `flat` (a multiple of 256): lane l
// holds values 8l .. 8l + 7 in v; lanes whose values lie past the end
// (valid false, whole 32-value blocks) write nothing. Bit-identical to
// kernels/src/quant/activation.rs. Outputs (matmul.cu's layout):
//   fmt 0 (Q8_0), 1 (Q8_1): per 32 values, d = amax / 127 rounded to f16
//     in ad[flat / 32 ..], q = round(v / d), Q8_1 also the f16-rounded
//     sum * d in as[];
//   fmt 2 (Q8_K, cols % 256 == 0): per 256 values the first value of
//     largest magnitude m, q = min(127, rint(-127 / m * v)), d = 1 /
//     (-127 / m) at ad[row * (cols / 32) + k], 16-value sums in bs.
__device__ __forceinline__ void quant_warp256(const float* v, bool valid, int fmt, u64 flat, int cols,
                                              i8* aq, float* ad, float* as, int* bs) {
    int lane = threadIdx.x % WARP;
    int q[8];
    if (fmt == 2) {
        float a = -1.0f, vb = 0.0f;
        int idx = 0;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (fabsf(v[j]) > a) { a = fabsf(v[j]); vb = v[j]; idx = 8 * lane + j; }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float a2 = __shfl_xor_sync(FULL_MASK, a, o), v2 = __shfl_xor_sync(FULL_MASK, vb, o);
            int i2 = __shfl_xor_sync(FULL_MASK, idx, o);
            if (a2 > a || (a2 == a && i2 < idx)) { a = a2; vb = v2; idx = i2; }
        }
        float iscale = a == 0.0f ? 0.0f : -127.0f / vb;
        int sum = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            q[j] = a == 0.0f ? 0 : min(127, (int)rintf(iscale * v[j]));
            sum += q[j];
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        if ((lane & 1) == 0) bs[flat / 16 + lane / 2] = sum;
        if (lane == 0) {
            u64 row = flat / cols, k = (flat % cols) / 256;
            ad[row * (cols / 32) + k] = a == 0.0f ? 0.0f : 1.0f / iscale;
        }
    } else {
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
        amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, 2));
        float d = amax / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            q[j] = (int)roundf(v[j] * id);
            sum += q[j];
        }
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        if (valid && (lane & 3) == 0) {
            u64 blk = (flat + 8 * lane) / 32;
            ad[blk] = h2f(f2h(d));
            if (fmt == 1) as[blk] = h2f(f2h((float)sum * d));
        }
    }
    if (valid) {
        int2 w;
        w.x = (q[0] & 0xff) | (q[1] & 0xff) << 8 | (q[2] & 0xff) << 16 | (u32)(q[3] & 0xff) << 24;
        w.y = (q[4] & 0xff) | (q[5] & 0xff) << 8 | (q[6] & 0xff) << 16 | (u32)(q[7] & 0xff) << 24;
        *(int2*)(aq + flat + 8 * lane) = w;
    }
}

// Lane l's 8 values of the 256 at `p` (n values in all from p; lanes past
// them get zeros and valid = false).
__device__ __forceinline__ bool load_warp256(const float* p, int n, float* v) {
    int lane = threadIdx.x % WARP;
    bool valid = 8 * lane < n;
    if (valid) {
        float4 a = *(const float4*)(p + 8 * lane), b = *(const float4*)(p + 8 * lane + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = 0.0f;
    }
    return valid;
}
