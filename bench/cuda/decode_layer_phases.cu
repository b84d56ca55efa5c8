// Where the fused decoder layer (kernels/cuda/decode_layer.cu) spends its
// time: launches it back to back on SmolLM2-135M's shape (weights of
// constant bytes, an f16 pool) and prints the time per launch and, for
// the last launch, the device clock at each stage mark (DL_MARK) of
// block 0's first thread. Built and run by scripts/device/decode-layer-phases.sh,
// which prepends the kernel sources (DS4_KERNEL_SOURCES) as NVRTC sees them.
#include <cstdio>
#include <cuda_runtime.h>

__device__ unsigned long long dl_marks[32];
#define DL_MARK(i)                                                              \
    do {                                                                        \
        if (threadIdx.x == 0 && cl_rank() == 0) {                               \
            unsigned long long t;                                               \
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));               \
            dl_marks[i] = t;                                                    \
        }                                                                       \
    } while (0)
#include DS4_KERNEL_SOURCES

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e = (x);                                                    \
        if (e != cudaSuccess) {                                                 \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                      \
            return 1;                                                           \
        }                                                                       \
    } while (0)

int main(int argc, char** argv) {
    int pos = argc > 1 ? atoi(argv[1]) : 16;
    const int E = 576, F = 1536, H = 9, HK = 3, HD = 64, bs = 16, nblk = 64;
    const int QD = H * HD, KVD = HK * HD, G = H / HK, NS = DL_CL / HK, A = F;
    if (pos >= nblk * bs) {
        printf("position %d past the pool (%d)\n", pos, nblk * bs);
        return 1;
    }
    long vals[7] = {(long)QD * E, (long)KVD * E, (long)KVD * E, (long)E * QD, (long)F * E, (long)F * E, (long)E * F};
    u8* w[7];
    for (int i = 0; i < 7; i++) {
        size_t bytes = vals[i] / 32 * 20;  // Q4_1: 20 bytes per 32 values
        CK(cudaMalloc(&w[i], bytes));
        CK(cudaMemset(w[i], 0x11, bytes));
    }
    float *x, *n1, *n2;
    CK(cudaMalloc(&x, E * 4));
    CK(cudaMalloc(&n1, E * 4));
    CK(cudaMalloc(&n2, E * 4));
    CK(cudaMemset(x, 0, E * 4));
    CK(cudaMemset(n1, 0, E * 4));
    CK(cudaMemset(n2, 0, E * 4));
    u64 block_elems = (u64)2 * 2 * bs * KVD;  // two layers
    u16* pool;
    CK(cudaMalloc(&pool, block_elems * nblk * 2));
    CK(cudaMemset(pool, 0, block_elems * nblk * 2));
    int info[4] = {pos / bs, pos % bs, pos, 0};
    u32 table[nblk];
    for (int i = 0; i < nblk; i++) table[i] = i;
    int* dinfo;
    u32* dtable;
    CK(cudaMalloc(&dinfo, sizeof info));
    CK(cudaMalloc(&dtable, sizeof table));
    CK(cudaMemcpy(dinfo, info, sizeof info, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dtable, table, sizeof table, cudaMemcpyHostToDevice));
    // decode_layer.rs's smem_bytes.
    auto r4 = [](int n) { return (n + 3) / 4 * 4; };
    int floats = r4(E) + 64 + r4(QD + 2 * KVD) + r4((G + 1) * HD) + r4(H * NS * (HD + 2)) +
                 r4(G * DL_WARPS * (HD + 2)) + r4(E) + r4(QD) + r4(F) + r4(E) + 2 * r4(A / 32);
    auto wrows = [](long n, long rb) { return ((n + DL_GW - 1) / DL_GW * DL_WARPS * rb + 15) / 16 * 16; };
    long wbytes = wrows(E, QD / 32 * 20) + 2 * wrows(F, E / 32 * 20) + wrows(E, F / 32 * 20);
    int smem = (int)(floats * 4 + A + wbytes);
    CK(cudaFuncSetAttribute(decode_layer_q4_1, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    CK(cudaFuncSetAttribute(decode_layer_q4_1, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int n = 200;
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaEventRecord(e0));
        for (int i = 0; i < n; i++)
            decode_layer_q4_1<<<DL_CL, DL_THREADS, smem>>>(x, n1, n2, w[0], w[1], w[2], w[3], w[4], w[5], w[6],
                                                          pool, dinfo, dtable, E, F, H, HK, 1e-5f, 0.125f, HD,
                                                          10000.0f, 1.0f, 0, bs, block_elems, 0);
        CK(cudaGetLastError());
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        printf("position %d: %.2f us per launch\n", pos, ms * 1000 / n);
    }
    unsigned long long m[32];
    CK(cudaMemcpyFromSymbol(m, dl_marks, sizeof m));
    const char* names[] = {"start", "after wait", "norm", "q/k/v rows", "barrier, read heads", "rope",
                           "attention", "barrier", "merge, quantize", "o rows", "barrier, read o",
                           "norm", "gate/up rows", "barrier", "read act, quantize", "down rows", "barrier"};
    printf("| stage (block 0) | us from start | us |\n| --- | ---: | ---: |\n");
    for (int i = 1; i < 17; i++)
        printf("| %s | %.2f | %.2f |\n", names[i], (m[i] - m[0]) / 1000.0, (m[i] - m[i - 1]) / 1000.0);
    return 0;
}
