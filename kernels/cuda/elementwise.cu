// Element-wise and row-wise ops (prepended: common.cuh). Launched only by
// kernels/src/cuda/elementwise.rs. Each op rounds like its CPU reference
// (kernels/src/cpu/elementwise.rs, rope.rs): __f*_rn keeps the compiler
// from contracting products and sums into FMAs.

#define NORM_KEEP 4096

// One block per row: out = x * (1 / sqrt(mean(x^2) + eps)) * w, the sum of
// squares in f64 like the CPU. With y: x += y first (add_assign's rounding),
// each thread adding the values it then reads back.
__device__ __forceinline__ void rms_norm_row(float* x, const float* y, const float* w, float* out, int cols,
                                             float eps, int fmt, i8* aq, float* ad, float* as, int* bs) {
    __shared__ double part[32];
    // The output also kept here for its quantization (rows of up to
    // NORM_KEEP values), which then reads shared memory instead of going
    // back to global memory for what this block just wrote.
    __shared__ float s_o[NORM_KEEP];
    bool keep = fmt >= 0 && cols <= NORM_KEEP;
    float* xr = x + (u64)blockIdx.x * cols;
    float* o = out + (u64)blockIdx.x * cols;
    double s = 0.0;
    // Unrolled so that a thread's loads are in flight together (the sum
    // stays in the thread's order).
#pragma unroll 4
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float f = xr[i];
        if (y) {
            f = __fadd_rn(f, y[(u64)blockIdx.x * cols + i]);
            xr[i] = f;
        }
        double v = (double)f;
        s += v * v;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(FULL_MASK, s, off);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) part[warp] = s;
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x / 32;
        s = lane < nw ? part[lane] : 0.0;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(FULL_MASK, s, off);
        if (lane == 0) part[0] = s;
    }
    __syncthreads();
    float scale = (float)(1.0 / sqrt(part[0] / (double)cols + (double)eps));
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float r = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
        o[i] = r;
        if (keep) s_o[i] = r;
    }
    if (fmt < 0) return;
    // The output quantized for the next matmul (quant_warp256), a warp per
    // 256 values, read back after the block's writes.
    __syncthreads();
    const float* src = keep ? s_o : o;
    int nw = blockDim.x / 32;
    for (int c = 256 * warp; c < cols; c += 256 * nw) {
        float v[8];
        bool valid = load_warp256(src + c, cols - c, v);
        quant_warp256(v, valid, fmt, (u64)blockIdx.x * cols + c, cols, aq, ad, as, bs);
    }
}

// fmt -1: no quantization; 0, 1, 2: also quantize the output to Q8_0,
// Q8_1 or Q8_K into aq, ad, as, bs (set only by CudaBackend's fusion of a
// matmul's activation quantization into the kernel that produced it).
extern "C" __global__ void rms_norm(const float* x, const float* w, float* out, int cols, float eps, int fmt,
                                    i8* aq, float* ad, float* as, int* bs) {
    pdl_wait();
    rms_norm_row((float*)x, nullptr, w, out, cols, eps, fmt, aq, ad, as, bs);
}

extern "C" __global__ void add_rms_norm(float* x, const float* y, const float* w, float* out, int cols,
                                        float eps, int fmt, i8* aq, float* ad, float* as, int* bs) {
    pdl_wait();
    rms_norm_row(x, y, w, out, cols, eps, fmt, aq, ad, as, bs);
}

// A warp per 256 values (8 per lane) of n; with fmt >= 0 (see rms_norm)
// also quantized, n and cols multiples of 32.
extern "C" __global__ void swiglu(const float* g, const float* u, float* out, u64 n, u64 cols, int fmt,
                                  i8* aq, float* ad, float* as, int* bs) {
    pdl_wait();
    u64 flat = ((u64)blockIdx.x * 8 + threadIdx.x / 32) * 256;
    if (flat >= n) return;  // whole warp out
    int lane = threadIdx.x % 32;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        u64 i = flat + 8 * lane + j;
        v[j] = 0.0f;
        if (i < n) {
            float x = g[i];
            v[j] = silu_mul(x, u[i]);
            out[i] = v[j];
        }
    }
    if (fmt >= 0) quant_warp256(v, flat + 8 * lane < n, fmt, flat, (int)cols, aq, ad, as, bs);
}

extern "C" __global__ void add_assign(float* x, const float* y, u64 n) {
    pdl_wait();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

// x[r][c] += bias[c] over a row-major [n / cols, cols] matrix.
extern "C" __global__ void add_bias(float* x, const float* bias, u64 n, u64 cols) {
    pdl_wait();
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], bias[i % cols]);
}

// In-place rotary embedding; one thread per (row, head, pair), over the
// heads of x ([rows, cols]) and then, when y is set, of y ([rows, cols_y],
// the keys of the same rows).
// mode 0: normal (pairs 2i, 2i+1); 1: neox (pairs i, i + n_rot/2).
extern "C" __global__ void rope(float* x, float* y, const u32* pos, int rows, int cols, int cols_y,
                                int head_dim, int n_rot, float freq_base, float freq_scale, int mode) {
    pdl_wait();
    int half = n_rot / 2;
    int heads_x = cols / head_dim;
    int heads = heads_x + cols_y / head_dim;
    u64 g = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (u64)rows * heads * half) return;
    int i = (int)(g % half);
    u64 rh = g / half;
    int h = (int)(rh % heads);
    int r = (int)(rh / heads);
    float c, s;
    rope_cs(pos[r], i, n_rot, freq_base, freq_scale, c, s);
    float* head = h < heads_x ? x + (u64)r * cols + (u64)h * head_dim
                              : y + (u64)r * cols_y + (u64)(h - heads_x) * head_dim;
    int a = mode == 0 ? 2 * i : i;
    int b = mode == 0 ? 2 * i + 1 : i + half;
    float x0 = head[a], x1 = head[b];
    rope_rot(x0, x1, c, s);
    head[a] = x0;
    head[b] = x1;
}

// One block (1024 threads) per row: index of the largest value, the first
// on ties (NaNs never win).
extern "C" __global__ void argmax_rows(const float* x, u32* out, int cols) {
    pdl_wait();
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* xr = x + (u64)blockIdx.x * cols;
    float bv = -__int_as_float(0x7f800000);
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = xr[i];
        if (v > bv) { bv = v; bi = i; }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float v2 = __shfl_xor_sync(FULL_MASK, bv, o);
        int i2 = __shfl_xor_sync(FULL_MASK, bi, o);
        if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; }
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x / 32;
        bv = lane < nw ? sv[lane] : -__int_as_float(0x7f800000);
        bi = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(FULL_MASK, bv, o);
            int i2 = __shfl_xor_sync(FULL_MASK, bi, o);
            if (v2 > bv || (v2 == bv && i2 < bi)) { bv = v2; bi = i2; }
        }
        if (lane == 0) out[blockIdx.x] = bi == 0x7fffffff ? 0u : (u32)bi;
    }
}

// Zeroes `bytes` at dst (16-byte aligned): the backend's memsets of fresh
// tensors where kernels launch early (sm_90+), so that one does not stop
// the kernels after it from launching before it finishes, as a memset
// node does. Waits like any kernel: the memory may be what a kernel ahead
// of it still reads. grid-stride, 256 threads, 16 bytes a thread a pass.
extern "C" __global__ void __launch_bounds__(256) zero_bytes(u8* dst, u64 bytes) {
    pdl_wait();
    u64 n16 = bytes / 16, step = (u64)gridDim.x * blockDim.x;
    uint4* d = (uint4*)dst;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += step) d[i] = make_uint4(0, 0, 0, 0);
    for (u64 i = n16 * 16 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += step) dst[i] = 0;
}
