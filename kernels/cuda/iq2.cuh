// IQ2_XXS on the device (prepended after quant.cuh to the sources that
// read weights; see kernels/src/cuda/compile.rs). The tables are ggml's
// iq2xxs_grid and ksigns_iq2xs (ggml-common.h), the same values as
// kernels/src/quant/iq2.rs.
//
// IQ2_XXS (66 bytes): d: f16 | 8 groups of 8 bytes, one per 32 values:
// u32 a (byte l: grid point of values 8l .. 8l + 7), u32 s (bits 7l ..
// 7l + 6: sign pattern of those values; top 4 bits: the group scale g).
// x = d * (0.5 + g) * 0.25 * grid * sign; ggml's dot with Q8_K sums
// (2g + 1) * isum per group and scales the row's sum by 0.125.

static __device__ const u64 iq2xxs_grid[256] = {
    0x0808080808080808ull, 0x080808080808082bull, 0x0808080808081919ull, 0x0808080808082b08ull,
    0x0808080808082b2bull, 0x0808080808190819ull, 0x0808080808191908ull, 0x08080808082b0808ull,
    0x08080808082b082bull, 0x08080808082b2b08ull, 0x08080808082b2b2bull, 0x0808080819080819ull,
    0x0808080819081908ull, 0x0808080819190808ull, 0x0808080819192b08ull, 0x08080808192b0819ull,
    0x08080808192b1908ull, 0x080808082b080808ull, 0x080808082b08082bull, 0x080808082b082b2bull,
    0x080808082b2b082bull, 0x0808081908080819ull, 0x0808081908081908ull, 0x0808081908190808ull,
    0x0808081908191919ull, 0x0808081919080808ull, 0x080808192b081908ull, 0x080808192b192b08ull,
    0x0808082b08080808ull, 0x0808082b0808082bull, 0x0808082b082b082bull, 0x0808082b2b08082bull,
    0x0808190808080819ull, 0x0808190808081908ull, 0x0808190808190808ull, 0x08081908082b0819ull,
    0x08081908082b1908ull, 0x0808190819080808ull, 0x080819081908082bull, 0x0808190819082b08ull,
    0x08081908192b0808ull, 0x080819082b080819ull, 0x080819082b081908ull, 0x080819082b190808ull,
    0x080819082b2b1908ull, 0x0808191908080808ull, 0x080819190808082bull, 0x0808191908082b08ull,
    0x08081919082b0808ull, 0x080819191908192bull, 0x08081919192b2b19ull, 0x080819192b080808ull,
    0x080819192b190819ull, 0x0808192b08082b19ull, 0x0808192b08190808ull, 0x0808192b19080808ull,
    0x0808192b2b081908ull, 0x0808192b2b2b1908ull, 0x08082b0808080808ull, 0x08082b0808081919ull,
    0x08082b0808082b08ull, 0x08082b0808191908ull, 0x08082b08082b2b08ull, 0x08082b0819080819ull,
    0x08082b0819081908ull, 0x08082b0819190808ull, 0x08082b081919082bull, 0x08082b082b082b08ull,
    0x08082b1908081908ull, 0x08082b1919080808ull, 0x08082b2b0808082bull, 0x08082b2b08191908ull,
    0x0819080808080819ull, 0x0819080808081908ull, 0x0819080808190808ull, 0x08190808082b0819ull,
    0x0819080819080808ull, 0x08190808192b0808ull, 0x081908082b081908ull, 0x081908082b190808ull,
    0x081908082b191919ull, 0x0819081908080808ull, 0x0819081908082b08ull, 0x08190819082b0808ull,
    0x0819081919190808ull, 0x0819081919192b2bull, 0x081908192b080808ull, 0x0819082b082b1908ull,
    0x0819082b19081919ull, 0x0819190808080808ull, 0x0819190808082b08ull, 0x08191908082b0808ull,
    0x08191908082b1919ull, 0x0819190819082b19ull, 0x081919082b080808ull, 0x0819191908192b08ull,
    0x08191919192b082bull, 0x0819192b08080808ull, 0x0819192b0819192bull, 0x08192b0808080819ull,
    0x08192b0808081908ull, 0x08192b0808190808ull, 0x08192b0819080808ull, 0x08192b082b080819ull,
    0x08192b1908080808ull, 0x08192b1908081919ull, 0x08192b192b2b0808ull, 0x08192b2b19190819ull,
    0x082b080808080808ull, 0x082b08080808082bull, 0x082b080808082b2bull, 0x082b080819081908ull,
    0x082b0808192b0819ull, 0x082b08082b080808ull, 0x082b08082b08082bull, 0x082b0819082b2b19ull,
    0x082b081919082b08ull, 0x082b082b08080808ull, 0x082b082b0808082bull, 0x082b190808080819ull,
    0x082b190808081908ull, 0x082b190808190808ull, 0x082b190819080808ull, 0x082b19081919192bull,
    0x082b191908080808ull, 0x082b191919080819ull, 0x082b1919192b1908ull, 0x082b192b2b190808ull,
    0x082b2b0808082b08ull, 0x082b2b08082b0808ull, 0x082b2b082b191908ull, 0x082b2b2b19081908ull,
    0x1908080808080819ull, 0x1908080808081908ull, 0x1908080808190808ull, 0x1908080808192b08ull,
    0x19080808082b0819ull, 0x19080808082b1908ull, 0x1908080819080808ull, 0x1908080819082b08ull,
    0x190808081919192bull, 0x19080808192b0808ull, 0x190808082b080819ull, 0x190808082b081908ull,
    0x190808082b190808ull, 0x1908081908080808ull, 0x19080819082b0808ull, 0x19080819192b0819ull,
    0x190808192b080808ull, 0x190808192b081919ull, 0x1908082b08080819ull, 0x1908082b08190808ull,
    0x1908082b19082b08ull, 0x1908082b1919192bull, 0x1908082b192b2b08ull, 0x1908190808080808ull,
    0x1908190808082b08ull, 0x19081908082b0808ull, 0x190819082b080808ull, 0x190819082b192b19ull,
    0x190819190819082bull, 0x19081919082b1908ull, 0x1908192b08080808ull, 0x19082b0808080819ull,
    0x19082b0808081908ull, 0x19082b0808190808ull, 0x19082b0819080808ull, 0x19082b0819081919ull,
    0x19082b1908080808ull, 0x19082b1919192b08ull, 0x19082b19192b0819ull, 0x19082b192b08082bull,
    0x19082b2b19081919ull, 0x19082b2b2b190808ull, 0x1919080808080808ull, 0x1919080808082b08ull,
    0x1919080808190819ull, 0x1919080808192b19ull, 0x19190808082b0808ull, 0x191908082b080808ull,
    0x191908082b082b08ull, 0x1919081908081908ull, 0x191908191908082bull, 0x191908192b2b1908ull,
    0x1919082b2b190819ull, 0x191919082b190808ull, 0x191919082b19082bull, 0x1919191908082b2bull,
    0x1919192b08080819ull, 0x1919192b19191908ull, 0x19192b0808080808ull, 0x19192b0808190819ull,
    0x19192b0808192b19ull, 0x19192b08192b1908ull, 0x19192b1919080808ull, 0x19192b2b08082b08ull,
    0x192b080808081908ull, 0x192b080808190808ull, 0x192b080819080808ull, 0x192b0808192b2b08ull,
    0x192b081908080808ull, 0x192b081919191919ull, 0x192b082b08192b08ull, 0x192b082b192b0808ull,
    0x192b190808080808ull, 0x192b190808081919ull, 0x192b191908190808ull, 0x192b19190819082bull,
    0x192b19192b081908ull, 0x192b2b081908082bull, 0x2b08080808080808ull, 0x2b0808080808082bull,
    0x2b08080808082b2bull, 0x2b08080819080819ull, 0x2b0808082b08082bull, 0x2b08081908081908ull,
    0x2b08081908192b08ull, 0x2b08081919080808ull, 0x2b08082b08190819ull, 0x2b08190808080819ull,
    0x2b08190808081908ull, 0x2b08190808190808ull, 0x2b08190808191919ull, 0x2b08190819080808ull,
    0x2b081908192b0808ull, 0x2b08191908080808ull, 0x2b0819191908192bull, 0x2b0819192b191908ull,
    0x2b08192b08082b19ull, 0x2b08192b19080808ull, 0x2b08192b192b0808ull, 0x2b082b080808082bull,
    0x2b082b1908081908ull, 0x2b082b2b08190819ull, 0x2b19080808081908ull, 0x2b19080808190808ull,
    0x2b190808082b1908ull, 0x2b19080819080808ull, 0x2b1908082b2b0819ull, 0x2b1908190819192bull,
    0x2b1908192b080808ull, 0x2b19082b19081919ull, 0x2b19190808080808ull, 0x2b191908082b082bull,
    0x2b19190819081908ull, 0x2b19191919190819ull, 0x2b192b082b080819ull, 0x2b192b19082b0808ull,
    0x2b2b08080808082bull, 0x2b2b080819190808ull, 0x2b2b08082b081919ull, 0x2b2b081908082b19ull,
    0x2b2b082b08080808ull, 0x2b2b190808192b08ull, 0x2b2b2b0819190808ull, 0x2b2b2b1908081908ull,
};

static __device__ const u8 ksigns_iq2xs[128] = {
    0, 129, 130, 3, 132, 5, 6, 135, 136, 9, 10, 139, 12, 141, 142, 15,
    144, 17, 18, 147, 20, 149, 150, 23, 24, 153, 154, 27, 156, 29, 30, 159,
    160, 33, 34, 163, 36, 165, 166, 39, 40, 169, 170, 43, 172, 45, 46, 175,
    48, 177, 178, 51, 180, 53, 54, 183, 184, 57, 58, 187, 60, 189, 190, 63,
    192, 65, 66, 195, 68, 197, 198, 71, 72, 201, 202, 75, 204, 77, 78, 207,
    80, 209, 210, 83, 212, 85, 86, 215, 216, 89, 90, 219, 92, 221, 222, 95,
    96, 225, 226, 99, 228, 101, 102, 231, 232, 105, 106, 235, 108, 237, 238, 111,
    240, 113, 114, 243, 116, 245, 246, 119, 120, 249, 250, 123, 252, 125, 126, 255,
};

// Grid point bytes gw (4 magnitudes) with the low 4 bits of sg as signs:
// each byte whose sign bit is set is negated ((x ^ 0xff) - 0xff = -x).
__device__ __forceinline__ int iq2_signed(u32 gw, u32 sg) {
    u32 m = (((sg & 15u) * 0x00204081u) & 0x01010101u) * 0xffu;
    return (int)__vsub4(gw ^ m, m);
}

// ksigns_iq2xs[x] without the lookup: x with bit 7 set where x has an
// odd number of bits (every pattern negates an even number of values).
__device__ __forceinline__ u32 iq2_signs(u32 x) { return x | ((__popc(x) & 1u) << 7); }

struct TIQ2_XXS {
    static constexpr int NSUB = 8, BYTES = 66, ACT = 2;
    static __device__ __forceinline__ int word(const u8* b, int sub, int i) {
        const u8* g = b + 2 + 8 * sub;
        u32 a = ld32_2(g), s = ld32_2(g + 4);
        int l = i >> 1, hf = i & 1;
        u32 gw = (u32)(iq2xxs_grid[(a >> (8 * l)) & 255] >> (32 * hf));
        return iq2_signed(gw, (u32)ksigns_iq2xs[(s >> (7 * l)) & 127] >> (4 * hf));
    }
    static __device__ __forceinline__ void scales(const u8* b, int sub, int& s0, int& s1, int& m) {
        int g = (int)(ld32_2(b + 6 + 8 * sub) >> 28);
        s0 = 2 * g + 1;
        s1 = s0;
        m = 0;
    }
    static __device__ __forceinline__ void deq(const u8* b, int sub, float* y) {
        const u8* g = b + 2 + 8 * sub;
        u32 a = ld32_2(g), s = ld32_2(g + 4);
        float db = __fmul_rn(__fmul_rn(ld_h(b), __fadd_rn(0.5f, (float)(s >> 28))), 0.25f);
#pragma unroll
        for (int l = 0; l < 4; l++) {
            u64 gp = iq2xxs_grid[(a >> (8 * l)) & 255];
            u32 sg = ksigns_iq2xs[(s >> (7 * l)) & 127];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int v = (int)((gp >> (8 * j)) & 255);
                y[8 * l + j] = __fmul_rn(db, (float)((sg >> j) & 1 ? -v : v));
            }
        }
    }
    static __device__ __forceinline__ u32 hdr(const u8* b) { return *(const u16*)b; }
    // ggml: 0.125 * sum over blocks of d * dy * isum. Scaling each block's
    // term by 0.125 (a power of two) rounds exactly as scaling the sum.
    static __device__ __forceinline__ float combine_h(u32 h, int isum, int, float ad, float) {
        return __fmul_rn(__fmul_rn(lo_h(h) * ad, (float)isum), 0.125f);
    }
};

// All 8 words and the scales of a chunk from its two words a (grid
// points) and s (signs, group scale).
__device__ __forceinline__ void iq2_expand(u32 a, u32 s, int* q, int& s0, int& s1, int& m) {
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u64 gp = iq2xxs_grid[(a >> (8 * l)) & 255];
        u32 sg = iq2_signs((s >> (7 * l)) & 127);
        q[2 * l] = iq2_signed((u32)gp, sg);
        q[2 * l + 1] = iq2_signed((u32)(gp >> 32), sg >> 4);
    }
    s0 = 2 * (int)(s >> 28) + 1;
    s1 = s0;
    m = 0;
}

// All 8 words of a chunk from its 4 grid points (word() looks each up twice).
template <>
__device__ __forceinline__ void load_chunk<TIQ2_XXS>(const u8* b, int sub, int* q, int& s0, int& s1, int& m) {
    const u8* g = b + 2 + 8 * sub;
    iq2_expand(ld32_2(g), ld32_2(g + 4), q, s0, s1, m);
}
