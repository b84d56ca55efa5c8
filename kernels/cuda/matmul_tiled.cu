// Shared-memory tiled int8 tensor-core matmul for batches of tokens,
// production numerics (prepended: common.cuh, quant.cuh, iq2.cuh).
// Launched only by kernels/src/cuda/matmul.rs. Same inputs, integers and
// per-block float combine as matmul.cu's mma kernel, summed over blocks
// in the same order, so its results equal that kernel's bit for bit (and
// the expert matvecs' of moe.cu: a routed row's result does not depend on
// which path its batch takes).
//
// Where a block's weight rows and activation rows are, and where its
// results go, is a tile policy P (row(r), act(t), store):
//   PlainTile (mmt*): rows row0 .. of one matrix x tokens tok0 .. of one
//     activation, out[tok, row]; grid (rows / BM, tokens / BN, K-splits);
//   GatherTile (mmg*, mmgu*): row block e of a stacked weight (an expert,
//     or a group of a grouped projection) x the activation rows a tile
//     lists: tiles[blockIdx.y] = (e, first, cnt) names positions p =
//     first + t * stride (t < cnt <= BN), activation row src[p] / div
//     (p without src), results at out[p, row]. Blocks past n_tiles (a
//     device-side count) exit. mmgu* computes gate (W0) and up (W1) rows
//     of the same outputs together: block row r is matrix (r / 8) % 2,
//     output j = row0 + 8 (r / 16) + r % 8, so that a thread's C fragment
//     holds gate and up of one (j, token) pair, and stores
//     swiglu_clamped_w(gate, up, clamp, wts[src[p]]) (64 outputs a block).
//
// A block computes BM = 32 * WR weight rows x BN = 32 * WC tokens; each
// of its WR * WC warps a 32 x 32 tile (2 x 4 mma tiles of 16 x 8). The
// reduction runs over K-tiles of 256 values (one K-quant super-block, or
// eight legacy blocks; the last tile of a legacy row may be shorter):
//   1. cp.async copies K-tile kt + 1's activation quants and scales into
//      the other half of a double buffer while kt is unpacked and
//      multiplied, and its raw weight bytes (each row's range widened to
//      16-byte units) into the one raw buffer once kt has been unpacked;
//   2. the block unpacks K-tile kt's raw weights once into an int8 tile,
//      integer chunk scales and each block's scale word (T::word,
//      T::scales, T::hdr);
//   3. each warp runs its mma tiles over the tile's 32-value chunks from
//      shared memory, keeps exact integer sums per weight block (legacy
//      formats: in the mma accumulators; K-quants: scaled per chunk) and
//      applies T::combine_h when a block ends.
// One raw buffer (not two) keeps a block under half of an H100/H200 SM's
// shared memory, so that two blocks share an SM.
//
// Dynamic shared memory (Layout below; tiled_smem_bytes in matmul.rs
// computes the same total), 16-byte aligned sections:
//   raw weights BM x RS | 2 stages x BN tokens x { quants 272 | 8 ad |
//   Q8_1: 8 sums | Q4_K, Q5_K, Q2_K: 16 16-value sums } | int8 weight tile
//   BM x 272 | scale words BM x blocks | K-quants: chunk scales BM x 9 |
//   Q4_K, Q5_K, Q2_K: min scales BM x 16 i8, activation sums split
//   BN x 2 x 16 i8 | activation row of each token BN x i32
// where RS = 16 * floor((TB + 30) / 16) covers TB = 8 * BYTES / NSUB raw
// bytes at any offset in a 16-byte unit. Row strides are chosen so that
// the fragment reads of a warp hit 32 different banks (int8 tile: 272
// bytes = 68 words; tokens: 304, 336 or 368 bytes).
//
// K-quant min terms (summs = sum over 16-value halves of min scale x
// activation sum) also run on the tensor cores, exactly: each activation
// sum s (|s| <= 2032) is split as 64 * (s >> 6) + (s & 63), two int8
// operands, so summs = 64 * mma(mins, hi) + mma(mins, lo).
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
template <> struct Halves<TQ2_K> { static constexpr bool v = true; };

// Byte offsets of the dynamic shared memory (see the top of the file).
template <class T, int BM, int BN>
struct Layout {
    static constexpr int TB = 8 * T::BYTES / T::NSUB;
    static constexpr int RS = 16 * ((TB + 30) / 16);
    static constexpr bool KQ = T::ACT == 2;            // K-quant: 8 chunks per block
    static constexpr bool MINS = KQ && HasMin<T>::v;   // Q4_K, Q5_K, Q2_K: a min term
    static constexpr int AD_N = 8;                     // ad floats per token (K: 1 used)
    static constexpr int AS_N = T::ACT == 1 ? 8 : 0;   // Q8_1 sums per token
    static constexpr int BS_N = MINS ? 16 : 0;         // Q8_K 16-value sums per token
    static constexpr int NB = 8 / T::NSUB;             // weight blocks per K-tile
    static constexpr int RAW = 0;                      // raw weight rows (one buffer)
    // Two activation stages.
    static constexpr int ACT = BM * RS;
    static constexpr int AD = TS;                      // offsets inside a stage, per BN
    static constexpr int AS = AD + 4 * AD_N;
    static constexpr int BS = AS + 4 * AS_N;
    static constexpr int ACT_TOK = BS + 4 * BS_N;      // bytes per token
    static constexpr int STAGE = BN * ACT_TOK;
    // Unpacked.
    static constexpr int Q = ACT + 2 * STAGE;          // int8 weight tile
    static constexpr int HDR = Q + BM * TS;            // T::hdr per (row, block)
    static constexpr int SC = HDR + 16 * ((BM * NB * 4 + 15) / 16);  // K: s0 | s1 << 16 per (row, chunk)
    static constexpr int MIN = SC + (KQ ? BM * 4 * SS : 0);    // min scales, 16 int8 per row
    static constexpr int BH = MIN + (MINS ? BM * 16 : 0);      // activation sums >> 6
    static constexpr int BL = BH + (MINS ? BN * 16 : 0);       // activation sums & 63
    static constexpr int SROW = BL + (MINS ? BN * 16 : 0);     // activation row per token
    static constexpr int END = SROW + BN * 4;
};

// ---- tile policies (see the top of the file) -----------------------------

// C fragment register k of row tile rt, token tile tt of warp (wr, wc):
// block row 32 wr + 16 rt + 8 (k / 2) + g, block token 32 wc + 8 tt +
// 2 t + k % 2 (g = lane / 4, t = lane % 4).
struct PlainTile {
    const u8* W;
    u64 rb;
    float* out;
    int n_out, n_tok, row0, tok0;
    __device__ __forceinline__ const u8* row(int r) const { return W + (u64)min(row0 + r, n_out - 1) * rb; }
    __device__ __forceinline__ int act(int t) const { return min(tok0 + t, n_tok - 1); }
    __device__ __forceinline__ void store(const float (&acc)[2][4][4], int wr, int wc, int g, int t) const {
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
};

template <bool GU>
struct GatherTile {
    const u8* W0;
    const u8* W1;
    u64 rb, e_row0;  // e_row0: the expert's first row (e * n_out)
    float* out;
    const int* src;
    const float* wts;
    float clamp;
    int n_out, row0, first, cnt, stride, div;
    __device__ __forceinline__ const u8* row(int r) const {
        if (GU) {
            int j = min(row0 + (((r >> 4) << 3) | (r & 7)), n_out - 1);
            return ((r >> 3) & 1 ? W1 : W0) + (e_row0 + (u64)j) * rb;
        }
        return W0 + (e_row0 + (u64)min(row0 + r, n_out - 1)) * rb;
    }
    __device__ __forceinline__ int act(int t) const {
        int p = first + min(t, cnt - 1) * stride;
        return src ? src[p] / div : p;
    }
    __device__ __forceinline__ void store(const float (&acc)[2][4][4], int wr, int wc, int g, int t) const {
#pragma unroll
        for (int rt = 0; rt < 2; rt++)
#pragma unroll
            for (int tt = 0; tt < 4; tt++)
#pragma unroll
                for (int k = 0; k < (GU ? 2 : 4); k++) {
                    int tl = 32 * wc + 8 * tt + 2 * t + (k & 1);
                    u64 p = (u64)(first + tl * stride);
                    if (GU) {
                        // k = 0, 1: gate; k + 2: up of the same output and token.
                        int j = row0 + 16 * wr + 8 * rt + g;
                        if (j < n_out && tl < cnt)
                            out[p * n_out + j] = swiglu_clamped_w(acc[rt][tt][k], acc[rt][tt][k + 2], clamp,
                                                                  wts[src[p]]);
                    } else {
                        int row = row0 + 32 * wr + 16 * rt + 8 * (k >> 1) + g;
                        if (row < n_out && tl < cnt) out[p * n_out + row] = acc[rt][tt][k];
                    }
                }
    }
};

// Starts the copy of K-tile kt's raw weight rows (16-byte units covering
// each row's bytes) into `raw`.
template <class T, int BM, int BN, int NTH, class P>
__device__ __forceinline__ void mmt_raw(const P& p, int n_in, int kt, u8* raw) {
    typedef Layout<T, BM, BN> L;
    int nc = min(8, n_in / 32 - 8 * kt);           // chunks in this K-tile
    int bytes = nc * T::BYTES / T::NSUB;           // K-quants: nc == NSUB
    for (int u = threadIdx.x; u < BM * (L::RS / 16); u += NTH) {
        int r = u / (L::RS / 16), k = u % (L::RS / 16);
        const u8* src = p.row(r) + (u64)kt * L::TB;
        const u8* a0 = (const u8*)((u64)src & ~(u64)15);
        if (a0 + 16 * k < src + bytes) cp_async16(raw + r * L::RS + 16 * k, a0 + 16 * k);
    }
}

// Starts the copy of K-tile kt's activation quants and scales into stage
// `st` (token t at t * ACT_TOK; its activation row srow[t]).
template <class T, int BM, int BN, int NTH>
__device__ __forceinline__ void mmt_act(const i8* aq, const float* ad, const float* as, const int* bs,
                                        int n_in, const int* srow, int kt, u8* st) {
    typedef Layout<T, BM, BN> L;
    int nc = min(8, n_in / 32 - 8 * kt);
    for (int u = threadIdx.x; u < BN * 16; u += NTH) {
        int t = u / 16, k = u % 16;
        if (k < 2 * nc) {  // the 16-byte units of the tile's nc chunks
            int tok = srow[t];
            cp_async16(st + t * L::ACT_TOK + 16 * k, aq + (u64)tok * n_in + (u64)kt * KT + 16 * k);
        }
    }
    int nab = n_in / 32;
    if (L::KQ) {
        for (int u = threadIdx.x; u < BN * 5; u += NTH) {
            int t = u / 5, k = u % 5;
            int tok = srow[t];
            u8* d = st + t * L::ACT_TOK;
            if (k < 4 && L::MINS)
                cp_async16(d + L::BS + 16 * k, bs + (u64)tok * (n_in / 16) + (u64)kt * 16 + 4 * k);
            else if (k == 4)
                cp_async4(d + L::AD, ad + (u64)tok * nab + kt);
        }
    } else {
        for (int u = threadIdx.x; u < BN * 8; u += NTH) {
            int t = u / 8, j = u % 8;
            if (j < nc) {
                int tok = srow[t];
                u64 ai = (u64)tok * nab + 8 * kt + j;
                u8* d = st + t * L::ACT_TOK;
                cp_async4(d + L::AD + 4 * j, ad + ai);
                if (T::ACT == 1) cp_async4(d + L::AS + 4 * j, as + ai);
            }
        }
    }
}

template <class T, int WR, int WC, class P>
__device__ __forceinline__ void mm_tiled(const P& p, const i8* aq, const float* ad, const float* as,
                                         const int* bs, int n_in, int kt_per) {
    constexpr int BM = 32 * WR, BN = 32 * WC, NTH = 32 * WR * WC;
    typedef Layout<T, BM, BN> L;
    extern __shared__ __align__(16) u8 smem[];
    u32 dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < L::END) __trap();  // the host's size disagrees with this layout
    u8* raw = smem + L::RAW;
    u8* sq = smem + L::Q;
    u32* shdr = (u32*)(smem + L::HDR);
    int* ssc = (int*)(smem + L::SC);
    u8* smin = smem + L::MIN;
    i8* sbh = (i8*)(smem + L::BH);
    i8* sbl = (i8*)(smem + L::BL);
    int* srow = (int*)(smem + L::SROW);
    for (int u = threadIdx.x; u < BN; u += NTH) srow[u] = p.act(u);
    __syncthreads();

    int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    int g = lane >> 2, t = lane & 3;
    int wr = warp % WR, wc = warp / WR;
    int nch = n_in / 32;
    // Split-K: block z takes K-tiles kt0 .. kt1 (its policy's output holds
    // the split's partial sums; mmt_split_sum adds them).
    int kt0 = blockIdx.z * kt_per, kt1 = min((nch + 7) / 8, kt0 + kt_per);

    // Per (row tile, token tile, C register): the float sum over finished
    // blocks and the integer sum of the current block.
    float acc[2][4][4];
    int bi[2][4][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 4; b++)
#pragma unroll
            for (int k = 0; k < 4; k++) { acc[a][b][k] = 0.0f; bi[a][b][k] = 0; }

    // Pipeline: the raw weights of K-tile kt + 1 are copied while kt is
    // multiplied (the raw buffer is free once kt is unpacked); activations
    // are double-buffered and copied one K-tile ahead.
    mmt_act<T, BM, BN, NTH>(aq, ad, as, bs, n_in, srow, kt0, smem + L::ACT + (kt0 & 1) * L::STAGE);
    mmt_raw<T, BM, BN, NTH>(p, n_in, kt0, raw);
    cp_async_commit();
    for (int kt = kt0; kt < kt1; kt++) {
        const u8* st = smem + L::ACT + (kt & 1) * L::STAGE;
        if (kt + 1 < kt1) {
            mmt_act<T, BM, BN, NTH>(aq, ad, as, bs, n_in, srow, kt + 1,
                                    smem + L::ACT + ((kt + 1) & 1) * L::STAGE);
            cp_async_commit();
            cp_async_wait<1>();  // all but this copy: K-tile kt's raw and activations
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        int nc = min(8, nch - 8 * kt);
        // Unpack: thread u takes chunk u % 8 of row u / 8.
        for (int u = threadIdx.x; u < BM * 8; u += NTH) {
            int r = u / 8, j = u % 8;
            if (j >= nc) continue;
            // The K-tile's offset inside its first 16-byte unit.
            int off = (int)((u64)(p.row(r) + (u64)kt * L::TB) & 15);
            const u8* blk = raw + r * L::RS + off + (j / T::NSUB) * T::BYTES;
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
            if (j % T::NSUB == 0) shdr[r * L::NB + j / T::NSUB] = T::hdr(blk);
            if (L::KQ) {
                ssc[r * SS + j] = (s0 & 0xffff) | (s1 << 16);
                // One min per 16 values (Min16: scales() packed them).
                if (L::MINS) ((u16*)(smin + r * 16))[j] = (u16)(Min16<T>::v ? m : m | (m << 8));
            }
        }
        if (L::MINS) {
            // The 16-value activation sums as 64 * h + l, both int8, for
            // the min term's two mma.
            for (int u = threadIdx.x; u < BN * 16; u += NTH) {
                int v = ((const int*)(st + (u / 16) * L::ACT_TOK + L::BS))[u % 16];
                sbh[u] = (i8)(v >> 6);
                sbl[u] = (i8)(v & 63);
            }
        }
        __syncthreads();
        if (kt + 1 < kt1) {
            mmt_raw<T, BM, BN, NTH>(p, n_in, kt + 1, raw);
            cp_async_commit();
        }
        for (int j = 0; j < nc; j++) {
            int a[2][4], s0[2][2], s1[2][2];
#pragma unroll
            for (int rt = 0; rt < 2; rt++) {
                int r = 32 * wr + 16 * rt + g;
                const u8* p = sq + r * TS + 32 * j + 4 * t;
                a[rt][0] = *(const int*)p;
                a[rt][1] = *(const int*)(p + 8 * TS);
                a[rt][2] = *(const int*)(p + 16);
                a[rt][3] = *(const int*)(p + 8 * TS + 16);
                if (L::KQ) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        int s = ssc[(r + 8 * h) * SS + j];
                        s0[rt][h] = (int)(short)(s & 0xffff);
                        s1[rt][h] = s >> 16;
                    }
                }
            }
#pragma unroll
            for (int tt = 0; tt < 4; tt++) {
                const u8* bp = st + (32 * wc + 8 * tt + g) * L::ACT_TOK + 32 * j + 4 * t;
                int b0 = *(const int*)bp, b1 = *(const int*)(bp + 16);
#pragma unroll
                for (int rt = 0; rt < 2; rt++) {
                    if (!L::KQ) {
                        mma_s8_k32(bi[rt][tt], a[rt], b0, b1);  // unscaled: one block per chunk
                    } else if (Halves<T>::v) {
                        int c[4] = {0, 0, 0, 0}, ch[4] = {0, 0, 0, 0};
                        mma_s8(c, a[rt][0], a[rt][1], b0);
                        mma_s8(ch, a[rt][2], a[rt][3], b1);
#pragma unroll
                        for (int k = 0; k < 4; k++)
                            bi[rt][tt][k] += s0[rt][k >> 1] * c[k] + s1[rt][k >> 1] * ch[k];
                    } else {
                        int c[4] = {0, 0, 0, 0};
                        mma_s8_k32(c, a[rt], b0, b1);
#pragma unroll
                        for (int k = 0; k < 4; k++) bi[rt][tt][k] += s0[rt][k >> 1] * c[k];
                    }
                }
            }
            if (j % T::NSUB != T::NSUB - 1) continue;
            // A weight block ends: its min term (K-quants) and the float
            // combine of every (row, token).
            int b = j / T::NSUB, ai = L::KQ ? 0 : j;
#pragma unroll
            for (int rt = 0; rt < 2; rt++) {
                int r = 32 * wr + 16 * rt + g;
                u32 hd[2] = {shdr[r * L::NB + b], shdr[(r + 8) * L::NB + b]};
                int am[2] = {0, 0};
                if (L::MINS) {
                    const u8* p = smin + r * 16 + 4 * t;
                    am[0] = *(const int*)p;
                    am[1] = *(const int*)(p + 8 * 16);
                }
#pragma unroll
                for (int tt = 0; tt < 4; tt++) {
                    int summs[4] = {0, 0, 0, 0};
                    if (L::MINS) {
                        int o = (32 * wc + 8 * tt + g) * 16 + 4 * t;
                        int ch[4] = {0, 0, 0, 0};
                        mma_s8(ch, am[0], am[1], *(const int*)(sbh + o));
                        mma_s8(summs, am[0], am[1], *(const int*)(sbl + o));
#pragma unroll
                        for (int k = 0; k < 4; k++) summs[k] += 64 * ch[k];
                    }
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const u8* tk = st + (32 * wc + 8 * tt + 2 * t + (k & 1)) * L::ACT_TOK;
                        float adv = ((const float*)(tk + L::AD))[ai];
                        float asv = T::ACT == 1 ? ((const float*)(tk + L::AS))[ai] : 0.0f;
                        // __fadd_rn: never contracted with combine's product.
                        acc[rt][tt][k] = __fadd_rn(acc[rt][tt][k],
                                                   T::combine_h(hd[k >> 1], bi[rt][tt][k], summs[k], adv, asv));
                        bi[rt][tt][k] = 0;
                    }
                }
            }
        }
        __syncthreads();
    }
    p.store(acc, wr, wc, g, t);
}

// out[i] = sum over z < splits of part[z * n + i], in order of z.
extern "C" __global__ void mmt_split_sum(const float* part, float* out, int n, int splits) {
    pdl_wait();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = part[i];
    for (int z = 1; z < splits; z++) v += part[(u64)z * n + i];
    out[i] = v;
}

// mmt<WC>_<type>: WR = 4 (128 weight rows), WC token warps (32 * WC
// tokens), grid.z K-splits of kt_per K-tiles each (split z writes its
// partial sums at out + z * n_tok * n_out).
template <class T, int WC>
__device__ __forceinline__ void mm_plain(const u8* W, u64 rb, const i8* aq, const float* ad, const float* as,
                                         const int* bs, float* out, int n_out, int n_in, int n_tok, int kt_per) {
    pdl_wait();
    PlainTile p;
    p.W = W;
    p.rb = rb;
    p.out = out + (u64)blockIdx.z * n_tok * n_out;
    p.n_out = n_out;
    p.n_tok = n_tok;
    p.row0 = blockIdx.x * 128;
    p.tok0 = blockIdx.y * 32 * WC;
    mm_tiled<T, 4, WC>(p, aq, ad, as, bs, n_in, kt_per);
}

#define MM_TILED(name, T)                                                                          \
    extern "C" __global__ void __launch_bounds__(128) mmt1_##name(                                 \
        const u8* W, u64 rb, const i8* aq, const float* ad, const float* as, const int* bs,       \
        float* out, int n_out, int n_in, int n_tok, int kt_per) {                                  \
        mm_plain<T, 1>(W, rb, aq, ad, as, bs, out, n_out, n_in, n_tok, kt_per);                   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2) mmt2_##name(                              \
        const u8* W, u64 rb, const i8* aq, const float* ad, const float* as, const int* bs,       \
        float* out, int n_out, int n_in, int n_tok, int kt_per) {                                  \
        mm_plain<T, 2>(W, rb, aq, ad, as, bs, out, n_out, n_in, n_tok, kt_per);                   \
    }

MM_TILED(q4_0, TQ4_0)
MM_TILED(q4_1, TQ4_1)
MM_TILED(q5_0, TQ5_0)
MM_TILED(q8_0, TQ8_0)
MM_TILED(q4_k, TQ4_K)
MM_TILED(q5_k, TQ5_K)
MM_TILED(q6_k, TQ6_K)
MM_TILED(q2_k, TQ2_K)
MM_TILED(iq2_xxs, TIQ2_XXS)

// mmg<WC>_<type> (one matrix) and mmgu<WC>_<type> (gate W0 and up W1 with
// the clamped SwiGLU): GatherTile blocks of 128 weight rows (mmgu: 64
// outputs) x 32 * WC listed activation rows; grid (row blocks, tile
// bound, K-splits: mmg only, split z writing at out + z * split_stride).
// n_out is the rows of one expert (or group).
#define GATHER_PARAMS                                                                              \
    const u8 *W0, const u8 *W1, u64 rb, int n_out, const int4 *tiles, const int *n_tiles,          \
        const int *src, int div, int stride, const i8 *aq, const float *ad, const float *as,       \
        const int *bs, float *out, u64 split_stride, const float *wts, float clamp, int n_in,      \
        int kt_per

template <class T, int WC, bool GU>
__device__ __forceinline__ void mm_gather(GATHER_PARAMS) {
    pdl_wait();
    if ((int)blockIdx.y >= *n_tiles) return;  // the whole block
    int4 tile = tiles[blockIdx.y];
    GatherTile<GU> p;
    p.W0 = W0;
    p.W1 = W1;
    p.rb = rb;
    p.e_row0 = (u64)tile.x * n_out;
    p.out = out + (u64)blockIdx.z * split_stride;
    p.src = src;
    p.wts = wts;
    p.clamp = clamp;
    p.n_out = n_out;
    p.row0 = blockIdx.x * (GU ? 64 : 128);
    p.first = tile.y;
    p.cnt = tile.z;
    p.stride = stride;
    p.div = div;
    mm_tiled<T, 4, WC>(p, aq, ad, as, bs, n_in, kt_per);
}

#define MM_GATHER(name, T)                                                                         \
    extern "C" __global__ void __launch_bounds__(128) mmg1_##name(GATHER_PARAMS) {                 \
        mm_gather<T, 1, false>(W0, W1, rb, n_out, tiles, n_tiles, src, div, stride, aq, ad, as, bs, \
                               out, split_stride, wts, clamp, n_in, kt_per);                       \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2) mmg2_##name(GATHER_PARAMS) {              \
        mm_gather<T, 2, false>(W0, W1, rb, n_out, tiles, n_tiles, src, div, stride, aq, ad, as, bs, \
                               out, split_stride, wts, clamp, n_in, kt_per);                       \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(128) mmgu1_##name(GATHER_PARAMS) {                \
        mm_gather<T, 1, true>(W0, W1, rb, n_out, tiles, n_tiles, src, div, stride, aq, ad, as, bs,  \
                              out, split_stride, wts, clamp, n_in, kt_per);                        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(256, 2) mmgu2_##name(GATHER_PARAMS) {             \
        mm_gather<T, 2, true>(W0, W1, rb, n_out, tiles, n_tiles, src, div, stride, aq, ad, as, bs,  \
                              out, split_stride, wts, clamp, n_in, kt_per);                        \
    }

MM_GATHER(q8_0, TQ8_0)
MM_GATHER(q4_k, TQ4_K)
MM_GATHER(q5_k, TQ5_K)
MM_GATHER(q6_k, TQ6_K)
MM_GATHER(q2_k, TQ2_K)
MM_GATHER(iq2_xxs, TIQ2_XXS)
