/*
 * ops_skinny.cu - the skinny decode GEMM of skinny_gemm.h on mma.sync
 * m16n8k16 (bf16 in, fp32 accumulate).
 *
 * The weight is the A operand (16 rows per warp), the T input rows the B
 * operand (n-tiles of 8 rows, NT = 1, 2, 4 or 8 of them), so a step's
 * weight bytes are read once. Both stream through shared memory in stages of
 * 128 k (256 bytes of each row) by cp.async with a 256-byte L2 prefetch,
 * 3 to 5 stages (~100 KB a block, two blocks an SM). A first version loaded
 * the fragments straight into registers, 4 slabs ahead, and reached only
 * 10-37% of copy bandwidth on the H100 (bench/NOTES.md).
 *
 * Fragments: per 32-wide k slab a lane (group g = lane / 4, t = lane % 4)
 * reads the 8 bf16 at k 8t..8t+7 of weight rows g and g + 8 and of input row
 * 8j + g of every n-tile j, one 16-byte shared load each. The MMA's k order
 * is a sum, so any pairing of A and B elements that multiplies matching k
 * works: the first MMA of a slab takes the words (k 8t, 8t+1) and (8t+2,
 * 8t+3) as its k pairs (2t, 2t+1) and (2t+8, 2t+9), the second the words at
 * 8t+4..8t+7 (PTX ISA, "Matrix Fragments for mma.m16n8k16": a0..a3 = row g /
 * g + 8 at k 2t / 2t + 8, b0, b1 = column g at k 2t / 2t + 8). Chunk c of a
 * stage row r is stored at c ^ 4 (r & 1): the 8 lanes of a shared-load phase
 * (rows 2q, 2q + 1, 4 chunks each) hit 8 distinct 16-byte bank groups.
 *
 * The weight part of the first stages is issued before the PDL wait (it
 * overlaps the previous kernel); the inputs after it.
 */
#include "cuda_common.cuh"
#include "skinny_gemm.h"

#define SK_BK 128            /* k per stage: 256 bytes of each weight row */
#define SK_CPR (SK_BK / 8)   /* 16-byte chunks per row of a stage */
#define SK_STAGE_BUDGET 102400 /* shared bytes per block: two blocks fit an SM */

/* cp.async of 16 bytes (zeros when !full) with a 256-byte L2 prefetch: the
 * next stage's piece of the same weight row comes from DRAM in the same burst */
static __device__ __forceinline__ void sk_cp16(void *dst, const void *src, bool full)
{
#if defined(__CUDA_ARCH__)
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(full ? 16 : 0)
                 : "memory");
#else
    cp_async16(dst, src, full);
#endif
}

/* partials of other blocks: from L2, never a stale L1 line */
static __device__ __forceinline__ float4 sk_ld_part(const float4 *p)
{
#if defined(__CUDA_ARCH__)
    return __ldcg(p);
#else
    return *p;
#endif
}
static __device__ __forceinline__ void sk_fence()
{
#if defined(__CUDA_ARCH__)
    __threadfence();
#endif
}
static __device__ __forceinline__ unsigned sk_ticket(unsigned *c)
{
#if defined(__CUDA_ARCH__)
    return atomicAdd(c, 1u);
#else
    return (*c)++; /* emulator: blocks run one after another */
#endif
}

static __device__ __forceinline__ void sk_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(KC_EMU)
    const uint32_t a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
    kc_emu_mma_m16n8k16_bf16(d, a, b);
#endif
}

enum { SK_STORE = 0, SK_ADD = 1, SK_BF16 = 2 };

/* stages for NT n-tiles and W warps: as many as SK_STAGE_BUDGET holds, 3 to 5 */
static __host__ __device__ constexpr int sk_stage_bytes(int NT, int W) { return (16 * W + 8 * NT) * SK_BK * 2; }
static __host__ __device__ constexpr int sk_stages(int NT, int W)
{
    return sk_stage_bytes(NT, W) * 5 <= SK_STAGE_BUDGET ? 5 : sk_stage_bytes(NT, W) * 4 <= SK_STAGE_BUDGET ? 4 : 3;
}
static __host__ __device__ constexpr size_t sk_smem(int NT, int W) { return (size_t)sk_stages(NT, W) * sk_stage_bytes(NT, W); }

template <int NT, int OUT, int W>
__global__ void __launch_bounds__(W * 32)
skinny_kernel(void *y, int ldy, const bf16 *__restrict__ Wt, int N, int K, const bf16 *__restrict__ x, int ldx, int T,
              float *__restrict__ ws, unsigned *__restrict__ cnt)
{
    constexpr int S = sk_stages(NT, W), BN = 16 * W, XR = 8 * NT;
    constexpr int WCH = BN * SK_CPR, XCH = XR * SK_CPR; /* 16-byte chunks per stage */
    KC_DYNAMIC_SMEM(smf);
    uint4 *sw = (uint4 *)smf;     /* [S][BN][SK_CPR] */
    uint4 *sx = sw + S * WCH;     /* [S][XR][SK_CPR] */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x, ks = blockIdx.y, KS = gridDim.y;
    const int nb0 = rb * BN;
    const int nst = K / SK_BK;
    const int st_beg = (int)((long long)ks * nst / KS);
    const int ns = (int)((long long)(ks + 1) * nst / KS) - st_beg;

    /* stage i of this block: weight rows nb0.., k (st_beg + i) * SK_BK.. -> buffer i % S */
    auto load_w = [&](int i) {
        uint4 *d = sw + (i % S) * WCH;
        const size_t k0 = (size_t)(st_beg + i) * SK_BK;
#pragma unroll
        for (int c = threadIdx.x; c < WCH; c += W * 32) {
            const int r = c / SK_CPR, ch = c % SK_CPR, n = nb0 + r;
            const bool ok = n < N;
            sk_cp16(d + r * SK_CPR + (ch ^ ((r & 1) << 2)), Wt + (size_t)(ok ? n : 0) * K + k0 + ch * 8, ok);
        }
    };
    auto load_x = [&](int i) {
        uint4 *d = sx + (i % S) * XCH;
        const size_t k0 = (size_t)(st_beg + i) * SK_BK;
        for (int c = threadIdx.x; c < XCH; c += W * 32) {
            const int r = c / SK_CPR, ch = c % SK_CPR;
            const bool ok = r < T;
            cp_async16(d + r * SK_CPR + (ch ^ ((r & 1) << 2)), x + (size_t)(ok ? r : 0) * ldx + k0 + ch * 8, ok);
        }
    };
    for (int i = 0; i < S - 1; i++)
        if (i < ns) load_w(i);

    KC_PDL_WAIT();
    KC_PDL_TRIGGER();

    /* group i: stage i's inputs (group 0 also every prologue weight stage) */
    for (int i = 0; i < S - 1; i++) {
        if (i < ns) load_x(i);
        cp_async_commit();
    }

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int ra = warp * 16 + g, rbr = ra + 8; /* this lane's weight rows in the block */

    for (int i = 0; i < ns; i++) {
        cp_async_wait<S - 2>();
        __syncthreads(); /* stage i landed for every thread; buffer (i - 1) % S is free */
        if (i + S - 1 < ns) {
            load_w(i + S - 1);
            load_x(i + S - 1);
        }
        cp_async_commit();
        const uint4 *bw = sw + (i % S) * WCH, *bx = sx + (i % S) * XCH;
#pragma unroll
        for (int h = 0; h < SK_BK / 32; h++) { /* the stage's 32-wide slabs */
            const int ch = 4 * h + t;
            const uint4 wa = bw[ra * SK_CPR + (ch ^ ((ra & 1) << 2))];
            const uint4 wb = bw[rbr * SK_CPR + (ch ^ ((rbr & 1) << 2))];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const int xr = 8 * j + g;
                const uint4 xv = bx[xr * SK_CPR + (ch ^ ((xr & 1) << 2))];
                sk_mma(acc[j], wa.x, wb.x, wa.y, wb.y, xv.x, xv.y);
                sk_mma(acc[j], wa.z, wb.z, wa.w, wb.w, xv.z, xv.w);
            }
        }
    }
    cp_async_wait<0>(); /* no copy outlives the block (the trailing groups are empty) */

    const int n0 = nb0 + warp * 16;
    /* fragment element i of n-tile j: weight row n0 + g (+8 for i >= 2), input row 8j + 2t + (i & 1) */
    auto emit = [&](int j, const float (&c)[4]) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int n = n0 + g + (i >> 1) * 8, tok = 8 * j + 2 * t + (i & 1);
            if (n >= N || tok >= T) continue;
            const size_t o = (size_t)tok * ldy + n;
            if (OUT == SK_BF16)
                ((bf16 *)y)[o] = f2bf(c[i]);
            else if (OUT == SK_ADD)
                ((float *)y)[o] += c[i];
            else
                ((float *)y)[o] = c[i];
        }
    };
    if (KS == 1) {
#pragma unroll
        for (int j = 0; j < NT; j++) emit(j, acc[j]);
        return;
    }

    /* split-K: this piece's tile to ws, in fragment order (float4 per lane and n-tile) */
    const size_t piece = (size_t)gridDim.x * W * NT * 32; /* float4s per piece */
    float4 *wp = (float4 *)ws + ((size_t)rb * W + warp) * NT * 32 + lane;
#pragma unroll
    for (int j = 0; j < NT; j++) wp[ks * piece + j * 32] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    sk_fence();
    __syncthreads();
    __shared__ unsigned s_last;
    if (threadIdx.x == 0) s_last = sk_ticket(&cnt[rb]) == (unsigned)(KS - 1);
    __syncthreads();
    if (!s_last) return;
    sk_fence();
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k = 0; k < KS; k++) {
            const float4 v = sk_ld_part(wp + k * piece + j * 32);
            c[0] += v.x, c[1] += v.y, c[2] += v.z, c[3] += v.w;
        }
        emit(j, c);
    }
    if (threadIdx.x == 0) cnt[rb] = 0u;
}

static int sk_nt(int T) { return T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8; }

/* upper bounds over both block widths: ceil(N / 64) * 64 <= ceil(N / 128) * 128 */
extern "C" size_t kc_skinny_ws_bytes(int T, int N, int ks)
{
    if (ks <= 1 || T <= 0 || N <= 0) return 0;
    return (size_t)ks * ((N + 127) / 128 * 128) * sk_nt(T) * 8 * sizeof(float);
}

extern "C" int kc_skinny_cnt_len(int N) { return N > 0 ? (N + 63) / 64 : 0; }

template <int NT, int OUT, int W>
static int sk_launch(void *y, int ldy, const uint16_t *x, int ldx, const uint16_t *Wt, int T, int N, int K, int ks,
                     float *ws, unsigned *cnt, cudaStream_t s)
{
    static bool attr_done = false; /* the first call of each instantiation comes from tuning or a test, never a capture */
    constexpr size_t smem = sk_smem(NT, W);
    if (!attr_done) {
        if (cudaFuncSetAttribute(skinny_kernel<NT, OUT, W>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            cudaSuccess) {
            (void)cudaGetLastError();
            return -7;
        }
        attr_done = true;
    }
    KC_LAUNCH(skinny_kernel<NT, OUT, W>, dim3((N + 16 * W - 1) / (16 * W), ks), dim3(W * 32), smem, s, y, ldy,
              (const bf16 *)Wt, N, K, (const bf16 *)x, ldx, T, ws, cnt);
    return 0;
}

template <int OUT, int W>
static int sk_dispatch(void *y, int ldy, const uint16_t *x, int ldx, const uint16_t *Wt, int T, int N, int K, int ks,
                       float *ws, unsigned *cnt, cudaStream_t s)
{
    switch (sk_nt(T)) {
    case 1: return sk_launch<1, OUT, W>(y, ldy, x, ldx, Wt, T, N, K, ks, ws, cnt, s);
    case 2: return sk_launch<2, OUT, W>(y, ldy, x, ldx, Wt, T, N, K, ks, ws, cnt, s);
    case 4: return sk_launch<4, OUT, W>(y, ldy, x, ldx, Wt, T, N, K, ks, ws, cnt, s);
    default: return sk_launch<8, OUT, W>(y, ldy, x, ldx, Wt, T, N, K, ks, ws, cnt, s);
    }
}

template <int OUT>
static int sk_width(int rows, void *y, int ldy, const uint16_t *x, int ldx, const uint16_t *Wt, int T, int N, int K,
                    int ks, float *ws, unsigned *cnt, cudaStream_t s)
{
    return rows == 128 ? sk_dispatch<OUT, 8>(y, ldy, x, ldx, Wt, T, N, K, ks, ws, cnt, s)
                       : sk_dispatch<OUT, 4>(y, ldy, x, ldx, Wt, T, N, K, ks, ws, cnt, s);
}

extern "C" int kc_gemm_skinny(void *y, int ybf, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N,
                              int K, float beta, int ks, int rows, float *ws, unsigned *cnt, cudaStream_t s)
{
    if (!y || !x || !W || T < 1 || T > KC_SKINNY_MAX_T || N < 1 || K < SK_BK || K % SK_BK || ks < 1 ||
        ks > KC_SKINNY_MAX_KS || ks > K / SK_BK || (rows != 64 && rows != 128) || ((uintptr_t)W & 15) ||
        ((uintptr_t)x & 15) || ldx < K || ldx % 8 || ldy < N || (beta != 0.0f && beta != 1.0f) ||
        (ybf && beta != 0.0f) || (ks > 1 && (!ws || !cnt)))
        return 1;
    if (ybf) return sk_width<SK_BF16>(rows, y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    if (beta != 0.0f) return sk_width<SK_ADD>(rows, y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    return sk_width<SK_STORE>(rows, y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
}
