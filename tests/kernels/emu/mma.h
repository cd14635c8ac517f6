/*
 * emu/mma.h - nvcuda::wmma for the CPU emulator, the fp32 / tf32 subset.
 * Each lane's fragment holds the whole tile (row-major), so element-wise
 * operations over x[0 .. num_elements) mean what they mean on the device.
 * Loads and stores check the device's rules (32-byte aligned pointer, ldm a
 * multiple of 4 floats) and are warp collectives.
 */
#ifndef KC_EMU_MMA_H
#define KC_EMU_MMA_H

#include "cuda_runtime.h"

namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
namespace precision {
struct tf32 {};
}
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int M, int N, int K> struct frag_shape;
template <int M, int N, int K> struct frag_shape<matrix_a, M, N, K> {
    enum { R = M, C = K };
};
template <int M, int N, int K> struct frag_shape<matrix_b, M, N, K> {
    enum { R = K, C = N };
};
template <int M, int N, int K> struct frag_shape<accumulator, M, N, K> {
    enum { R = M, C = N };
};

template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    enum { rows = frag_shape<Use, M, N, K>::R, cols = frag_shape<Use, M, N, K>::C, num_elements = rows * cols };
    float x[num_elements];
};

static inline void kc_emu_check_tile(const void *p, unsigned ld, const char *what)
{
    if (((uintptr_t)p & 31) || (ld & 3)) {
        fprintf(stderr, "kc_emu: wmma %s: pointer %p not 32-byte aligned or ldm %u not a multiple of 4\n", what, p, ld);
        abort();
    }
}

/* element (r, c) of the logical tile in memory with leading dimension ld */
template <class L> static inline size_t kc_emu_at(int r, int c, unsigned ld)
{
    return std::is_same<L, row_major>::value ? (size_t)r * ld + c : (size_t)c * ld + r;
}

template <class Use, int M, int N, int K, class T, class L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const float *p, unsigned ld)
{
    kc_emu_warp_barrier();
    kc_emu_check_tile(p, ld, "load_matrix_sync");
    typedef fragment<Use, M, N, K, T, L> F;
    for (int r = 0; r < F::rows; r++)
        for (int c = 0; c < F::cols; c++) f.x[r * F::cols + c] = p[kc_emu_at<L>(r, c, ld)];
}
template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float> &f, const float *p, unsigned ld, layout_t l)
{
    kc_emu_warp_barrier();
    kc_emu_check_tile(p, ld, "load_matrix_sync (accumulator)");
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++)
            f.x[r * N + c] = l == mem_row_major ? p[(size_t)r * ld + c] : p[(size_t)c * ld + r];
}
template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float> &f, unsigned ld, layout_t l)
{
    kc_emu_warp_barrier();
    kc_emu_check_tile(p, ld, "store_matrix_sync");
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) (l == mem_row_major ? p[(size_t)r * ld + c] : p[(size_t)c * ld + r]) = f.x[r * N + c];
}
template <class Use, int M, int N, int K, class T, class L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, float v)
{
    for (int i = 0; i < fragment<Use, M, N, K, T, L>::num_elements; i++) f.x[i] = v;
}
template <int M, int N, int K, class T, class LA, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float> &d, const fragment<matrix_a, M, N, K, T, LA> &a,
                            const fragment<matrix_b, M, N, K, T, LB> &b, const fragment<accumulator, M, N, K, float> &c)
{
    kc_emu_warp_barrier();
    kc_emu_mma(d.x, a.x, b.x, c.x, M, N, K);
}
/* cvt.rna.tf32.f32: 10 mantissa bits, ties away from zero */
static inline float __float_to_tf32(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}
} // namespace wmma
} // namespace nvcuda

#endif
