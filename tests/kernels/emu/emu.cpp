#ifdef _FORTIFY_SOURCE /* its longjmp check rejects jumps between fiber stacks */
#undef _FORTIFY_SOURCE
#endif
/*
 * emu.cpp - the CPU emulator behind the headers here: runs kernels of kernels/
 * compiled as C++ (-DKC_EMU) so their indexing, barriers and arithmetic can
 * be tested on a machine without a GPU. Not a performance model.
 *
 * Each CUDA thread of a block is a fiber (makecontext to start it on its own
 * stack, _setjmp/_longjmp to switch). A fiber runs until it reaches a block
 * barrier (__syncthreads), a warp barrier (shuffles, __syncwarp, wmma) or its
 * end; the scheduler then runs the next ready fiber (in thread order, or in
 * reverse with KC_EMU_ORDER=rev, so that a missing barrier shows either way)
 * and releases a barrier once every live thread of the block / warp waits at
 * it. Mixed waits are a deadlock: reported with each thread's state, then
 * abort(). Device memory is host memory with an inaccessible page right
 * after every allocation and after the dynamic shared memory (sized exactly
 * as launched, filled with NaN bytes at each block start), so overruns fault;
 * SIGSEGV prints the kernel, block and thread. cp.async copies land at the
 * matching cp.async.wait_group (KC_EMU_CPASYNC=issue: at issue instead).
 */
#include "cuda_runtime.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <vector>

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* what kernels/ops_basic.cu provides in the real build */
extern "C" {
int kc_pdl_on = 0;
void kc_set_pdl(int on) { kc_pdl_on = on; }
}

namespace {

enum { READY, AT_BLOCK, AT_WARP, DONE };
struct Fiber {
    jmp_buf env;
    int state;
};
struct Copy {
    void *dst;
    const void *src;
    bool full;
    int bytes; /* 4, 8 or 16 */
};

const size_t kStack = 256 * 1024;
std::vector<Fiber> fibers;
int nthr, cur;
char *stacks;
int stacks_n;
jmp_buf sched_env;
ucontext_t start_uc;
const std::function<void()> *g_body;
const void *g_kernel;
float *g_smem;
size_t g_smem_bytes;
bool g_rev, g_cp_at_issue;
uint64_t xchg[32][32];
struct MmaBuf {
    unsigned gen;
    float d[256], a[256], b[256], c[256];
};
MmaBuf mmabuf[32];
std::vector<unsigned> lane_gen;
std::vector<std::deque<std::vector<Copy>>> cp_groups;
std::vector<std::vector<Copy>> cp_open;
std::map<const void *, int> smem_limit;
std::map<void *, std::pair<char *, size_t>> allocs;
cudaError_t last_error = cudaSuccess;
size_t page;

void set_tid(int t)
{
    cur = t;
    threadIdx.x = t % blockDim.x;
    threadIdx.y = (t / blockDim.x) % blockDim.y;
    threadIdx.z = t / (blockDim.x * blockDim.y);
}

void trampoline()
{
    if (_setjmp(fibers[cur].env) == 0) _longjmp(sched_env, 1);
    (*g_body)();
    /* copies nobody waited for still land (the kernel had no use for them) */
    while (!cp_groups[cur].empty()) {
        for (const Copy &c : cp_groups[cur].front()) c.full ? (void)memcpy(c.dst, c.src, c.bytes) : (void)memset(c.dst, 0, c.bytes);
        cp_groups[cur].pop_front();
    }
    fibers[cur].state = DONE;
    _longjmp(sched_env, 1);
}

void create(int t)
{
    getcontext(&start_uc);
    start_uc.uc_stack.ss_sp = stacks + (size_t)t * kStack;
    start_uc.uc_stack.ss_size = kStack;
    start_uc.uc_link = nullptr;
    makecontext(&start_uc, trampoline, 0);
    set_tid(t);
    if (_setjmp(sched_env) == 0) setcontext(&start_uc);
}

void resume(int t)
{
    set_tid(t);
    if (_setjmp(sched_env) == 0) _longjmp(fibers[t].env, 1);
}

void yield_as(int state)
{
    fibers[cur].state = state;
    if (_setjmp(fibers[cur].env) == 0) _longjmp(sched_env, 1);
}

const char *state_name(int s) { return s == READY ? "ready" : s == AT_BLOCK ? "__syncthreads" : s == AT_WARP ? "warp barrier" : "done"; }

void deadlock()
{
    fprintf(stderr, "kc_emu: deadlock in kernel %p block (%u,%u,%u): threads wait at different barriers\n", g_kernel,
            blockIdx.x, blockIdx.y, blockIdx.z);
    for (int t = 0; t < nthr; t++)
        if (t == 0 || fibers[t].state != fibers[t - 1].state) fprintf(stderr, "  thread %d..: %s\n", t, state_name(fibers[t].state));
    abort();
}

void run_block()
{
    for (int t = 0; t < nthr; t++) {
        fibers[t].state = READY;
        lane_gen[t] = 0;
        cp_groups[t].clear();
        cp_open[t].clear();
    }
    for (int w = 0; w < 32; w++) mmabuf[w].gen = 0;
    memset(g_smem, 0xFF, g_smem_bytes);
    for (int t = 0; t < nthr; t++) create(t);
    for (;;) {
        int ran = 0;
        for (int i = 0; i < nthr; i++) {
            const int t = g_rev ? nthr - 1 - i : i;
            if (fibers[t].state == READY) resume(t), ran++;
        }
        int live = 0, at_block = 0;
        for (int t = 0; t < nthr; t++) live += fibers[t].state != DONE, at_block += fibers[t].state == AT_BLOCK;
        if (!live) return;
        int released = 0;
        if (at_block == live) {
            for (int t = 0; t < nthr; t++)
                if (fibers[t].state == AT_BLOCK) fibers[t].state = READY;
            released = 1;
        } else {
            for (int w = 0; w * 32 < nthr; w++) {
                int nd = 0, aw = 0;
                for (int t = 32 * w; t < 32 * w + 32 && t < nthr; t++)
                    nd += fibers[t].state != DONE, aw += fibers[t].state == AT_WARP;
                if (nd && aw == nd) {
                    for (int t = 32 * w; t < 32 * w + 32 && t < nthr; t++)
                        if (fibers[t].state == AT_WARP) fibers[t].state = READY;
                    released++;
                }
            }
        }
        if (!released && !ran) deadlock();
    }
}

void on_segv(int sig)
{
    fprintf(stderr, "kc_emu: signal %d in kernel %p block (%u,%u,%u) thread %d (an access past an allocation or the "
                    "shared memory?)\n",
            sig, g_kernel, blockIdx.x, blockIdx.y, blockIdx.z, cur);
    _exit(3);
}

void init_once()
{
    static bool done;
    if (done) return;
    done = true;
    page = (size_t)sysconf(_SC_PAGESIZE);
    const char *o = getenv("KC_EMU_ORDER");
    g_rev = o && !strcmp(o, "rev");
    const char *c = getenv("KC_EMU_CPASYNC");
    g_cp_at_issue = c && !strcmp(c, "issue");
    static char altstack[1 << 16];
    stack_t ss;
    ss.ss_sp = altstack, ss.ss_size = sizeof altstack, ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_segv;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
}

/* n bytes ending right before an inaccessible page; 256-byte aligned */
void *guarded_alloc(size_t n, char **base_out, size_t *total_out)
{
    const size_t rs = (n + 255) & ~(size_t)255, pages = (rs + page - 1) / page, total = (pages + 1) * page;
    char *base = (char *)mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    mprotect(base + pages * page, page, PROT_NONE);
    *base_out = base, *total_out = total;
    return base + pages * page - rs;
}

} // namespace

/* ---- device-side hooks ---- */
void __syncthreads() { yield_as(AT_BLOCK); }
void __syncwarp(unsigned) { yield_as(AT_WARP); }
void kc_emu_warp_barrier() { yield_as(AT_WARP); }
int kc_emu_lane() { return cur & 31; }
void kc_emu_mma_m16n8k8(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    static float A[32][16][8], B[32][8][8]; /* per warp, as xchg */
    const int w = cur >> 5, l = cur & 31, g = l >> 2, t = l & 3;
    auto val = [](uint32_t u) {
        u &= 0xffffe000u;
        float x;
        memcpy(&x, &u, 4);
        return x;
    };
    A[w][g][t] = val(a[0]), A[w][g + 8][t] = val(a[1]), A[w][g][t + 4] = val(a[2]), A[w][g + 8][t + 4] = val(a[3]);
    B[w][t][g] = val(b[0]), B[w][t + 4][g] = val(b[1]);
    yield_as(AT_WARP);
    for (int i = 0; i < 4; i++) {
        const int r = g + (i >> 1) * 8, n = 2 * t + (i & 1);
        float s = c[i];
        for (int k = 0; k < 8; k++) s = fmaf(A[w][r][k], B[w][k][n], s);
        c[i] = s;
    }
    yield_as(AT_WARP); /* the deposits stay until every lane has read them */
}
/* mma.sync.m16n8k16 .bf16 (PTX fragment layout: lane 4 g + t holds A rows
 * g, g + 8 at k 2t, 2t + 1 (regs 0, 1) and k 2t + 8, 2t + 9 (regs 2, 3), low
 * half first; B column g at k 2t, 2t + 1 and 2t + 8, 2t + 9; C as m16n8k8):
 * products exact in fp32 (bf16 x bf16), summed in k order */
void kc_emu_mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2])
{
    static float A[32][16][16], B[32][16][8]; /* per warp */
    const int w = cur >> 5, l = cur & 31, g = l >> 2, t = l & 3;
    auto lo = [](uint32_t u) {
        const uint32_t v = u << 16;
        float x;
        memcpy(&x, &v, 4);
        return x;
    };
    auto hi = [](uint32_t u) {
        const uint32_t v = u & 0xffff0000u;
        float x;
        memcpy(&x, &v, 4);
        return x;
    };
    for (int h = 0; h < 2; h++) { /* h = 1: k + 8 */
        A[w][g][2 * t + 8 * h] = lo(a[2 * h]), A[w][g][2 * t + 1 + 8 * h] = hi(a[2 * h]);
        A[w][g + 8][2 * t + 8 * h] = lo(a[2 * h + 1]), A[w][g + 8][2 * t + 1 + 8 * h] = hi(a[2 * h + 1]);
        B[w][2 * t + 8 * h][g] = lo(b[h]), B[w][2 * t + 1 + 8 * h][g] = hi(b[h]);
    }
    yield_as(AT_WARP);
    for (int i = 0; i < 4; i++) {
        const int r = g + (i >> 1) * 8, n = 2 * t + (i & 1);
        float s = c[i];
        for (int k = 0; k < 16; k++) s = fmaf(A[w][r][k], B[w][k][n], s);
        c[i] = s;
    }
    yield_as(AT_WARP);
}
uint64_t kc_emu_warp_exchange(uint64_t v, int src)
{
    const int w = cur >> 5;
    xchg[w][cur & 31] = v;
    yield_as(AT_WARP);
    const uint64_t r = xchg[w][src];
    yield_as(AT_WARP);
    return r;
}
unsigned kc_emu_ballot(int pred)
{
    static int dep[32][32];
    const int w = cur >> 5;
    dep[w][cur & 31] = pred != 0;
    yield_as(AT_WARP);
    unsigned m = 0;
    for (int l = 0; l < 32; l++) m |= (unsigned)dep[w][l] << l;
    yield_as(AT_WARP);
    return m;
}
void kc_emu_ldmatrix_x4(uint32_t (&r)[4], const void *row, bool trans)
{
    static const uint16_t *rows[32][32];
    const int w = cur >> 5, l = cur & 31, g = l >> 2, t = l & 3;
    if ((uintptr_t)row & 15) {
        fprintf(stderr, "kc_emu: ldmatrix row address %p not 16-byte aligned, thread %d\n", row, cur);
        abort();
    }
    rows[w][l] = (const uint16_t *)row;
    yield_as(AT_WARP);
    for (int m = 0; m < 4; m++) {
        uint16_t lo, hi;
        if (!trans) lo = rows[w][8 * m + g][2 * t], hi = rows[w][8 * m + g][2 * t + 1];
        else lo = rows[w][8 * m + 2 * t][g], hi = rows[w][8 * m + 2 * t + 1][g];
        r[m] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    yield_as(AT_WARP);
}
float *kc_emu_dynamic_smem() { return g_smem; }

void kc_emu_cp_async16(void *dst, const void *src, bool full)
{
    if (((uintptr_t)dst & 15) || ((uintptr_t)src & 15)) {
        fprintf(stderr, "kc_emu: cp.async of 16 bytes with a misaligned address (dst %p src %p), thread %d\n", dst, src, cur);
        abort();
    }
    if (g_cp_at_issue) {
        full ? (void)memcpy(dst, src, 16) : (void)memset(dst, 0, 16);
        return;
    }
    cp_open[cur].push_back(Copy{dst, src, full, 16});
}
void kc_emu_cp_async(void *dst, const void *src, int bytes)
{
    if ((bytes != 4 && bytes != 8 && bytes != 16) || ((uintptr_t)dst % bytes) || ((uintptr_t)src % bytes)) {
        fprintf(stderr, "kc_emu: cp.async of %d bytes with a bad size or misaligned address (dst %p src %p), thread %d\n",
                bytes, dst, src, cur);
        abort();
    }
    if (g_cp_at_issue) {
        memcpy(dst, src, bytes);
        return;
    }
    cp_open[cur].push_back(Copy{dst, src, true, bytes});
}
void kc_emu_cp_async_commit()
{
    if (g_cp_at_issue) return;
    cp_groups[cur].push_back(cp_open[cur]);
    cp_open[cur].clear();
}
void kc_emu_cp_async_wait(int n)
{
    while ((int)cp_groups[cur].size() > n) {
        for (const Copy &c : cp_groups[cur].front()) c.full ? (void)memcpy(c.dst, c.src, c.bytes) : (void)memset(c.dst, 0, c.bytes);
        cp_groups[cur].pop_front();
    }
}

void kc_emu_mma(float *d, const float *a, const float *b, const float *c, int M, int N, int K)
{
    const int w = cur >> 5;
    const unsigned g = ++lane_gen[cur];
    MmaBuf &m = mmabuf[w];
    if (M * N > 256 || M * K > 256 || K * N > 256) abort();
    if (m.gen != g) {
        for (int r = 0; r < M; r++)
            for (int cc = 0; cc < N; cc++) {
                float s = c[r * N + cc];
                for (int k = 0; k < K; k++) s = fmaf(a[r * K + k], b[k * N + cc], s);
                m.d[r * N + cc] = s;
            }
        memcpy(m.a, a, (size_t)M * K * 4), memcpy(m.b, b, (size_t)K * N * 4), memcpy(m.c, c, (size_t)M * N * 4);
        m.gen = g;
    } else if (memcmp(m.a, a, (size_t)M * K * 4) || memcmp(m.b, b, (size_t)K * N * 4) || memcmp(m.c, c, (size_t)M * N * 4)) {
        fprintf(stderr, "kc_emu: mma_sync operands differ between lanes of warp %d (thread %d): lane-dependent fragment values\n", w, cur);
        abort();
    }
    memcpy(d, m.d, (size_t)M * N * 4);
}

cudaError_t kc_emu_set_smem_limit(const void *kernel, int bytes)
{
    if (bytes < 0 || bytes > 232448) return last_error = cudaErrorInvalidValue;
    smem_limit[kernel] = bytes;
    return cudaSuccess;
}

cudaError_t kc_emu_launch(const void *kernel, dim3 grid, dim3 block, size_t smem, const std::function<void()> &body)
{
    init_once();
    const long n = (long)block.x * block.y * block.z;
    const auto it = smem_limit.find(kernel);
    const size_t limit = it == smem_limit.end() ? 48 * 1024 : (size_t)it->second;
    if (n <= 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
        smem > limit)
        return last_error = cudaErrorInvalidConfiguration;
    if (n > stacks_n) {
        if (stacks) munmap(stacks, (size_t)stacks_n * kStack);
        stacks = (char *)mmap(nullptr, (size_t)n * kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (long t = 0; t < n; t++) mprotect(stacks + t * kStack, page, PROT_NONE); /* overflow guard */
        stacks_n = (int)n;
    }
    nthr = (int)n;
    fibers.resize(n), lane_gen.resize(n), cp_groups.resize(n), cp_open.resize(n);
    char *sbase = nullptr;
    size_t stotal = 0;
    g_smem = (float *)guarded_alloc(smem ? smem : 16, &sbase, &stotal);
    g_smem_bytes = smem;
    /* the pointer ends at the guard page: a kernel asking for more than it launched with faults */
    g_smem = (float *)((char *)g_smem + (((smem + 255) & ~(size_t)255) - smem));
    if (((uintptr_t)g_smem & 127) && smem) g_smem = (float *)((uintptr_t)g_smem & ~(uintptr_t)127);
    blockDim = block, gridDim = grid, g_body = &body, g_kernel = kernel;
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x; x++) {
                blockIdx.x = x, blockIdx.y = y, blockIdx.z = z;
                run_block();
            }
    munmap(sbase, stotal);
    return cudaSuccess;
}

/* ---- host API ---- */
extern "C" {
cudaError_t cudaMalloc(void **p, size_t n)
{
    init_once();
    char *base;
    size_t total;
    void *q = guarded_alloc(n ? n : 1, &base, &total);
    if (!q) return last_error = cudaErrorMemoryAllocation;
    memset(q, 0xA5, n); /* garbage, as device memory is */
    allocs[q] = std::make_pair(base, total);
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    auto it = allocs.find(p);
    if (it == allocs.end()) return last_error = cudaErrorInvalidValue;
    munmap(it->second.first, it->second.second);
    allocs.erase(it);
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind)
{
    memmove(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind k, cudaStream_t)
{
    return cudaMemcpy(dst, src, n, k);
}
cudaError_t cudaMemset(void *dst, int v, size_t n)
{
    memset(dst, v, n);
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "kc_emu (CPU emulator)");
    p->multiProcessorCount = 132;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int)
{
    *v = a == cudaDevAttrMultiProcessorCount ? 132 : 0;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument (emulator)";
    default: return "launch failure (emulator)";
    }
}
struct CUevent_st {
    double t;
};
cudaError_t cudaEventCreate(cudaEvent_t *e)
{
    *e = new CUevent_st{0};
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    e->t = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
}
