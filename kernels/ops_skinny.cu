/*
 * ops_skinny.cu - the skinny decode GEMM of skinny_gemm.h on mma.sync
 * m16n8k16 (bf16 in, fp32 accumulate).
 *
 * The weight is the A operand (16 rows per warp), the T input rows the B
 * operand (n-tiles of 8 rows, NT = 1, 2, 4 or 8 of them), so a step's
 * weight bytes are read once and every lane's loads are 16 bytes wide with
 * no shared-memory staging: per 32-wide k slab a lane (group g = lane / 4,
 * t = lane % 4) loads the 8 bf16 at k 8t..8t+7 of weight rows g and g + 8
 * and of input row 8j + g of every n-tile j. The MMA's k order is a sum, so
 * any pairing of A and B elements that multiplies matching k works: the first
 * MMA of a slab takes the words (k 8t, 8t+1) and (8t+2, 8t+3) as its k pairs
 * (2t, 2t+1) and (2t+8, 2t+9), the second MMA the words at 8t+4..8t+7
 * (PTX ISA, "Matrix Fragments for mma.m16n8k16": a0..a3 = row g / g + 8 at
 * k 2t / 2t + 8, b0, b1 = column g at k 2t / 2t + 8).
 *
 * Weight loads bypass L1 (read once) and run SK_U slabs ahead of the MMAs in
 * a register ring; the first SK_U are issued before the PDL wait, so they
 * overlap the previous kernel. Input rows are read through L1 (every warp of
 * the block reads the same ones), one slab ahead.
 */
#include "cuda_common.cuh"
#include "skinny_gemm.h"

#define SK_WARPS 8
#define SK_U 4 /* weight slabs in flight per lane (even: the input double buffer follows slab parity) */
static_assert(SK_WARPS * 16 == KC_SKINNY_ROWS, "a block owns 16 weight rows per warp");

#if defined(KC_EMU)
/* the emulator's bf16 m16n8k16 (emu.cpp) */
void kc_emu_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2]);
#endif

/* weights: read once, no L1 allocation */
static __device__ __forceinline__ uint4 sk_ld_stream(const uint4 *p)
{
#if defined(__CUDA_ARCH__)
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return *p;
#endif
}
/* input rows: written by the previous kernel (read after the PDL wait), cached in L1 */
static __device__ __forceinline__ uint4 sk_ld_x(const uint4 *p)
{
#if defined(__CUDA_ARCH__)
    return __ldg(p);
#else
    return *p;
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

template <int NT, int OUT>
__global__ void __launch_bounds__(SK_WARPS * 32)
skinny_kernel(void *y, int ldy, const bf16 *__restrict__ W, int N, int K, const bf16 *__restrict__ x, int ldx, int T,
              float *__restrict__ ws, unsigned *__restrict__ cnt)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rb = blockIdx.x, ks = blockIdx.y, KS = gridDim.y;
    const int n0 = rb * KC_SKINNY_ROWS + warp * 16;
    const int nsl = K / 32;
    const int s_beg = (int)((long long)ks * nsl / KS);
    const int ns = (int)((long long)(ks + 1) * nsl / KS) - s_beg;
    /* rows past N read row N - 1 (in bounds); their sums are never written */
    const int ra = min(n0 + g, N - 1), rbw = min(n0 + g + 8, N - 1);
    const uint4 *pa = (const uint4 *)(W + (size_t)ra * K + (size_t)s_beg * 32) + t;
    const uint4 *pb = (const uint4 *)(W + (size_t)rbw * K + (size_t)s_beg * 32) + t;
    const uint4 z4 = make_uint4(0, 0, 0, 0);

    uint4 wa[SK_U], wb[SK_U];
#pragma unroll
    for (int u = 0; u < SK_U; u++) {
        wa[u] = u < ns ? sk_ld_stream(pa + 4 * u) : z4;
        wb[u] = u < ns ? sk_ld_stream(pb + 4 * u) : z4;
    }

    KC_PDL_WAIT();
    KC_PDL_TRIGGER();

    const uint4 *px[NT];
    bool xv[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int tok = 8 * j + g;
        xv[j] = tok < T;
        px[j] = (const uint4 *)(x + (size_t)(xv[j] ? tok : 0) * ldx + (size_t)s_beg * 32) + t;
    }
    uint4 xr[2][NT];
#pragma unroll
    for (int j = 0; j < NT; j++) xr[0][j] = xv[j] && ns > 0 ? sk_ld_x(px[j]) : z4;

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    for (int s0 = 0; s0 < ns; s0 += SK_U) {
#pragma unroll
        for (int u = 0; u < SK_U; u++) {
            const int s = s0 + u;
            if (s < ns) {
                const int cb = u & 1; /* s0 is a multiple of SK_U (even): slab s's inputs are in xr[s & 1] */
                if (s + 1 < ns) {
#pragma unroll
                    for (int j = 0; j < NT; j++) xr[cb ^ 1][j] = xv[j] ? sk_ld_x(px[j] + 4 * (s + 1)) : z4;
                }
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    sk_mma(acc[j], wa[u].x, wb[u].x, wa[u].y, wb[u].y, xr[cb][j].x, xr[cb][j].y);
                    sk_mma(acc[j], wa[u].z, wb[u].z, wa[u].w, wb[u].w, xr[cb][j].z, xr[cb][j].w);
                }
                if (s + SK_U < ns) {
                    wa[u] = sk_ld_stream(pa + 4 * (s + SK_U));
                    wb[u] = sk_ld_stream(pb + 4 * (s + SK_U));
                }
            }
        }
    }

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
    const size_t piece = (size_t)gridDim.x * SK_WARPS * NT * 32; /* float4s per piece */
    float4 *wp = (float4 *)ws + ((size_t)rb * SK_WARPS + warp) * NT * 32 + lane;
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

extern "C" size_t kc_skinny_ws_bytes(int T, int N, int ks)
{
    if (ks <= 1 || T <= 0 || N <= 0) return 0;
    return (size_t)ks * kc_skinny_cnt_len(N) * SK_WARPS * sk_nt(T) * 32 * sizeof(float4);
}

extern "C" int kc_skinny_cnt_len(int N) { return N > 0 ? (N + KC_SKINNY_ROWS - 1) / KC_SKINNY_ROWS : 0; }

template <int NT, int OUT>
static int sk_launch(void *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N, int K, int ks,
                     float *ws, unsigned *cnt, cudaStream_t s)
{
    KC_LAUNCH(skinny_kernel<NT, OUT>, dim3(kc_skinny_cnt_len(N), ks), dim3(SK_WARPS * 32), 0, s, y, ldy,
              (const bf16 *)W, N, K, (const bf16 *)x, ldx, T, ws, cnt);
    return 0;
}

template <int OUT>
static int sk_dispatch(void *y, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N, int K, int ks,
                       float *ws, unsigned *cnt, cudaStream_t s)
{
    switch (sk_nt(T)) {
    case 1: return sk_launch<1, OUT>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    case 2: return sk_launch<2, OUT>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    case 4: return sk_launch<4, OUT>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    default: return sk_launch<8, OUT>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    }
}

extern "C" int kc_gemm_skinny(void *y, int ybf, int ldy, const uint16_t *x, int ldx, const uint16_t *W, int T, int N,
                              int K, float beta, int ks, float *ws, unsigned *cnt, cudaStream_t s)
{
    if (!y || !x || !W || T < 1 || T > KC_SKINNY_MAX_T || N < 1 || K < 32 || K % 32 || ks < 1 ||
        ks > KC_SKINNY_MAX_KS || ks > K / 32 || ((uintptr_t)W & 15) || ((uintptr_t)x & 15) || ldx < K || ldx % 8 ||
        ldy < N || (beta != 0.0f && beta != 1.0f) || (ybf && beta != 0.0f) || (ks > 1 && (!ws || !cnt)))
        return 1;
    if (ybf) return sk_dispatch<SK_BF16>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    if (beta != 0.0f) return sk_dispatch<SK_ADD>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
    return sk_dispatch<SK_STORE>(y, ldy, x, ldx, W, T, N, K, ks, ws, cnt, s);
}
