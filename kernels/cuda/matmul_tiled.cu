// Shared-memory tiled int8 tensor-core matmul for batches of tokens,
// production numerics (prepended: common.cuh, quant.cuh). Launched only by
// kernels/src/cuda/matmul.rs. Same inputs, integers and per-block float
// combine as matmul.cu's kernels, summed over blocks in the same order,
// so its results equal theirs bit for bit.
//
// A block computes BM = 32 * WR weight rows x BN = 32 * WC tokens; each
// of its WR * WC warps a 32 x 32 tile (2 x 4 mma tiles of 16 x 8). The
// reduction runs over K-tiles of 256 values (one K-quant super-block, or
// eight legacy blocks; the last tile of a legacy row may be shorter):
//   1. cp.async copies the next K-tile's raw weight bytes (each row's
//      range widened to 16-byte units), activation quants and activation
//      scales into the other half of a double buffer, so that the copy
//      runs while this tile is computed;
//   2. the block unpacks this tile's raw weights once into an int8 tile
//      and integer scales (T::word, T::scales);
//   3. each warp runs its mma tiles over the tile's 32-value chunks from
//      shared memory, keeps exact integer sums per weight block and
//      applies T::combine (reading the block's d from the raw copy) when
//      a block ends.
//
// Dynamic shared memory (16-byte aligned sections; mmt_smem_bytes in
// matmul.rs computes the same total):
//   2 stages x { raw weights BM x RS | activation quants BN x 272 |
//                ad BN x 8 f32 | as BN x 8 f32 | bs BN x 16 i32 }
//   int8 weight tile BM x 272 | scales BM x 9 i32 | mins BM x 9 i32
// where RS = 16 * floor((TB + 30) / 16) covers TB = 8 * BYTES / NSUB raw
// bytes at any offset in a 16-byte unit. Rows are padded (272 = 256 + 16
// bytes, 9 words) so that the fragment reads hit 32 different banks.
//
// The widened copy may read up to 15 bytes past a weight row's last
// block: within the same 16-byte unit, so within the same mapped page.

#define KT 256    // values per K-tile
#define TS 272    // row stride of the int8 tiles (bytes)
#define SS 9      // row stride of the scale tiles (words)

// Which formats have two scales per 32-value chunk (one per half): their
// chunk takes two k16 mma, the others one k32 mma.
template <class T> struct Halves { static constexpr bool v = false; };
template <> struct Halves<TQ6_K> { static constexpr bool v = true; };

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src));
#else
    __trap();
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

template <class T>
struct Tile {
    static constexpr int TB = 8 * T::BYTES / T::NSUB;
    static constexpr int RS = 16 * ((TB + 30) / 16);
    static constexpr int ACT_BYTES = TS + 32 + 32 + 64;  // per token per stage
};

// Byte offset of weight row `row`'s K-tile kt inside its first 16-byte unit.
__device__ __forceinline__ int raw_off(const u8* W, u64 rb, int row, int kt, int tb) {
    return (int)((u64)(W + (u64)row * rb + (u64)kt * tb) & 15);
}

template <class T, int BM, int BN, int NTH>
__device__ __forceinline__ void mmt_stage(const u8* W, u64 rb, const i8* aq, const float* ad,
                                          const float* as, const int* bs, int n_out, int n_in,
                                          int n_tok, int row0, int tok0, int kt, u8* st) {
    constexpr int TB = Tile<T>::TB, RS = Tile<T>::RS;
    u8* raw = st;
    u8* act = raw + BM * RS;
    float* sad = (float*)(act + BN * TS);
    float* sas = sad + BN * 8;
    int* sbs = (int*)(sas + BN * 8);
    int nch = n_in / 32;
    int nc = min(8, nch - 8 * kt);                 // chunks in this K-tile
    int bytes = nc * T::BYTES / T::NSUB;           // K-quants: nc == NSUB
    for (int u = threadIdx.x; u < BM * (RS / 16); u += NTH) {
        int r = u / (RS / 16), k = u % (RS / 16);
        int row = min(row0 + r, n_out - 1);
        const u8* src = W + (u64)row * rb + (u64)kt * TB;
        const u8* a0 = (const u8*)((u64)src & ~(u64)15);
        if (a0 + 16 * k < src + bytes) cp_async16(raw + r * RS + 16 * k, a0 + 16 * k);
    }
    for (int u = threadIdx.x; u < BN * 16; u += NTH) {
        int t = u / 16, k = u % 16;
        if (k < 2 * nc) {  // the 16-byte units of the tile's nc chunks
            int tok = min(tok0 + t, n_tok - 1);
            cp_async16(act + t * TS + 16 * k, aq + (u64)tok * n_in + (u64)kt * KT + 16 * k);
        }
    }
    int nab = n_in / 32;
    if (T::ACT == 2) {
        for (int u = threadIdx.x; u < BN * 5; u += NTH) {
            int t = u / 5, k = u % 5;
            int tok = min(tok0 + t, n_tok - 1);
            if (k < 4)
                cp_async16(sbs + t * 16 + 4 * k, bs + (u64)tok * (n_in / 16) + (u64)kt * 16 + 4 * k);
            else
                cp_async4(sad + t * 8, ad + (u64)tok * nab + kt);
        }
    } else {
        for (int u = threadIdx.x; u < BN * 8; u += NTH) {
            int t = u / 8, j = u % 8;
            if (j < nc) {
                int tok = min(tok0 + t, n_tok - 1);
                u64 ai = (u64)tok * nab + 8 * kt + j;
                cp_async4(sad + t * 8 + j, ad + ai);
                if (T::ACT == 1) cp_async4(sas + t * 8 + j, as + ai);
            }
        }
    }
}

template <class T, int WR, int WC>
__device__ __forceinline__ void mm_tiled(const u8* W, u64 rb, const i8* aq, const float* ad,
                                         const float* as, const int* bs, float* out, int n_out,
                                         int n_in, int n_tok) {
    constexpr int BM = 32 * WR, BN = 32 * WC, NTH = 32 * WR * WC;
    constexpr int TB = Tile<T>::TB, RS = Tile<T>::RS;
    constexpr int STAGE = BM * RS + BN * Tile<T>::ACT_BYTES;
    extern __shared__ __align__(16) u8 smem[];
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < 2 * STAGE + BM * (TS + 2 * 4 * SS)) __trap();  // host and kernel disagree
    u8* sq = smem + 2 * STAGE;                     // int8 weight tile
    int* ssc = (int*)(sq + BM * TS);               // s0 | s1 << 16 per (row, chunk)
    int* smn = ssc + BM * SS;                      // min scale per (row, chunk)

    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int g = lane >> 2, t = lane & 3;
    int wr = warp % WR, wc = warp / WR;
    int row0 = blockIdx.x * BM, tok0 = blockIdx.y * BN;
    int nch = n_in / 32, nkt = (nch + 7) / 8;

    float acc[2][4][4];
    int bi[2][4][4], bm[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int k = 0; k < 4; k++) { acc[a][b][k] = 0.0f; bi[a][b][k] = 0; bm[a][b][k] = 0; }

    mmt_stage<T, BM, BN, NTH>(W, rb, aq, ad, as, bs, n_out, n_in, n_tok, row0, tok0, 0, smem);
    cp_async_commit();
    for (int kt = 0; kt < nkt; kt++) {
        u8* st = smem + (kt & 1) * STAGE;
        if (kt + 1 < nkt) {
            mmt_stage<T, BM, BN, NTH>(W, rb, aq, ad, as, bs, n_out, n_in, n_tok, row0, tok0, kt + 1,
                                      smem + ((kt + 1) & 1) * STAGE);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const u8* raw = st;
        const u8* act = raw + BM * RS;
        const float* sad = (const float*)(act + BN * TS);
        const float* sas = sad + BN * 8;
        const int* sbs = (const int*)(sas + BN * 8);
        int nc = min(8, nch - 8 * kt);
        // Unpack: thread u takes chunk u % 8 of row u / 8.
        for (int u = threadIdx.x; u < BM * 8; u += NTH) {
            int r = u / 8, j = u % 8;
            if (j >= nc) continue;
            int row = min(row0 + r, n_out - 1);
            const u8* blk = raw + r * RS + raw_off(W, rb, row, kt, TB) + (j / T::NSUB) * T::BYTES;
            int q[8], s0, s1, m;
            load_chunk<T>(blk, j % T::NSUB, q, s0, s1, m);
            int4* dst = (int4*)(sq + r * TS + 32 * j);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int4 v;
                v.x = q[4 * h];
                v.y = q[4 * h + 1];
                v.z = q[4 * h + 2];
                v.w = q[4 * h + 3];
                dst[h] = v;
            }
            ssc[r * SS + j] = (s0 & 0xffff) | (s1 << 16);
            smn[r * SS + j] = m;
        }
        __syncthreads();
        int offs[2][2];  // raw offsets of this lane's four rows
#pragma unroll
        for (int rt = 0; rt < 2; rt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int r = 32 * wr + 16 * rt + 8 * h + g;
                offs[rt][h] = r * RS + raw_off(W, rb, min(row0 + r, n_out - 1), kt, TB);
            }
        for (int j = 0; j < nc; j++) {
            int a[2][4], s0[2][2], s1[2][2], mn[2][2];
#pragma unroll
            for (int rt = 0; rt < 2; rt++) {
                int r = 32 * wr + 16 * rt + g;
                const u8* p = sq + r * TS + 32 * j + 4 * t;
                a[rt][0] = *(const int*)p;
                a[rt][1] = *(const int*)(p + 8 * TS);
                a[rt][2] = *(const int*)(p + 16);
                a[rt][3] = *(const int*)(p + 8 * TS + 16);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int s = ssc[(r + 8 * h) * SS + j];
                    s0[rt][h] = (int)(short)(s & 0xffff);
                    s1[rt][h] = s >> 16;
                    mn[rt][h] = T::ACT == 2 ? smn[(r + 8 * h) * SS + j] : 0;
                }
            }
#pragma unroll
            for (int tt = 0; tt < 4; tt++) {
                int tb = 32 * wc + 8 * tt;
                const u8* bp = act + (tb + g) * TS + 32 * j + 4 * t;
                int b0 = *(const int*)bp, b1 = *(const int*)(bp + 16);
                int bsum[2] = {0, 0};
                if (T::ACT == 2) {
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int* q = sbs + (tb + 2 * t + e) * 16 + 2 * j;
                        bsum[e] = q[0] + q[1];
                    }
                }
#pragma unroll
                for (int rt = 0; rt < 2; rt++) {
                    int c[4] = {0, 0, 0, 0};
                    if (Halves<T>::v) {
                        int ch[4] = {0, 0, 0, 0};
                        mma_s8(c, a[rt][0], a[rt][1], b0);
                        mma_s8(ch, a[rt][2], a[rt][3], b1);
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            bi[rt][tt][k] += s0[rt][k >> 1] * c[k] + s1[rt][k >> 1] * ch[k];
                    } else {
                        mma_s8_k32(c, a[rt], b0, b1);
#pragma unroll
                        for (int k = 0; k < 4; k++) bi[rt][tt][k] += s0[rt][k >> 1] * c[k];
                    }
                    if (T::ACT == 2) {
#pragma unroll
                        for (int k = 0; k < 4; k++) bm[rt][tt][k] += mn[rt][k >> 1] * bsum[k & 1];
                    }
                }
            }
            if (j % T::NSUB == T::NSUB - 1) {  // a weight block ends
#pragma unroll
                for (int rt = 0; rt < 2; rt++)
#pragma unroll
                    for (int tt = 0; tt < 4; tt++)
#pragma unroll
                        for (int k = 0; k < 4; k++) {
                            int tl = 32 * wc + 8 * tt + 2 * t + (k & 1);
                            const u8* blk = raw + offs[rt][k >> 1] + (j / T::NSUB) * T::BYTES;
                            int ai = T::ACT == 2 ? 0 : j;
                            acc[rt][tt][k] += T::combine(blk, bi[rt][tt][k], bm[rt][tt][k], sad[tl * 8 + ai],
                                                         T::ACT == 1 ? sas[tl * 8 + ai] : 0.0f);
                            bi[rt][tt][k] = 0;
                            bm[rt][tt][k] = 0;
                        }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int rt = 0; rt < 2; rt++)
#pragma unroll
        for (int tt = 0; tt < 4; tt++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int row = row0 + 32 * wr + 16 * rt + 8 * (k >> 1) + g;
                int tok = tok0 + 32 * wc + 8 * tt + 2 * t + (k & 1);
                if (row < n_out && tok < n_tok) out[(u64)tok * n_out + row] = acc[rt][tt][k];
            }
}

// mmt<WC>_<type>: WR = 4 (128 weight rows), WC token warps (32 * WC tokens).
#define MM_TILED(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mmt1_##name(                                 \
        const u8* W, u64 rb, const i8* aq, const float* ad, const float* as, const int* bs,       \
        float* out, int n_out, int n_in, int n_tok) {                                             \
        mm_tiled<T, 4, 1>(W, rb, aq, ad, as, bs, out, n_out, n_in, n_tok);                        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(256) mmt2_##name(                                 \
        const u8* W, u64 rb, const i8* aq, const float* ad, const float* as, const int* bs,       \
        float* out, int n_out, int n_in, int n_tok) {                                             \
        mm_tiled<T, 4, 2>(W, rb, aq, ad, as, bs, out, n_out, n_in, n_tok);                        \
    }

MM_TILED(q4_0, TQ4_0)
MM_TILED(q4_1, TQ4_1)
MM_TILED(q5_0, TQ5_0)
MM_TILED(q8_0, TQ8_0)
MM_TILED(q4_k, TQ4_K)
MM_TILED(q5_k, TQ5_K)
MM_TILED(q6_k, TQ6_K)
