/*
 * cuda_internal.h - the CUDA backend's executor state, shared by its parts:
 *   cuda_backend.cu  create / destroy, sequences, the startup report
 *   cuda_weights.cu  weight upload and re-layout (once, at create)
 *   cuda_forward.cu  the forward pass over the rows of one pass
 *   cuda_step.cu     a step: packing (cuda_plan.c), graphs, outputs
 * Sizes, offsets, the KV allocator and step packing are the planner's
 * (cuda_plan.h, plain C, tested in CI).
 *
 * Invariants: slot s's KDA state and token history are only written by rows
 * of slot s; padding rows carry slot -1 and no kernel touches any state for
 * them; a KV block is written only by the slot that holds it at that
 * position: blocks shared with prefix snapshots are read-only to everyone
 * else (cuda_plan.h kv_alloc).
 */
#ifndef KDA_CUDA_INTERNAL_H
#define KDA_CUDA_INTERNAL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "cuda_gemm.h"
#include "cuda_ops.h"
#include "cuda_plan.h"
#include "kda_chunk.h"
#include "prefill_ops.h"
#include "model.h"

#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            snprintf(err, errlen, "CUDA error %s at %s:%d (%s)", cudaGetErrorString(e_), __FILE__, \
                     __LINE__, #call);                                                             \
            return KDA_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)
/* a kc_* launcher's status (0 or negative) */
#define KC_CHECK(call)                                                                             \
    do {                                                                                           \
        if ((call) != 0) {                                                                         \
            snprintf(err, errlen, "kernel launch failed at %s:%d (%s)", __FILE__, __LINE__, #call);\
            return KDA_EDEVICE;                                                                    \
        }                                                                                          \
    } while (0)

typedef struct {
    uint16_t *w_mix;   /* KDA: [q|k|v|f0|g0|b rows, D]; GQA: [q|gate|k|v rows, D] bf16 */
    uint16_t *w_o;     /* [D, HV or Hq*hd] */
    uint16_t *w_gu;    /* [2F, D] gate rows then up rows */
    uint16_t *w_down;  /* [D, F] */
    float *attn_norm, *mlp_norm; /* [D] */
    float *gu_bias, *down_bias;  /* [2F], [D] (mlp_bias) or NULL */
    int n_mix;         /* rows of w_mix */
    /* KDA (cp_dims: H value heads, QK = q/k width) */
    float *convw;      /* [2QK+HV, taps] */
    float *conv_bias;  /* [2QK+HV] or NULL */
    uint16_t *f1t, *g1t; /* [R, HK], [R, HV]: the decode kernel's low-rank layout */
    uint16_t *f1, *g1;   /* [HK, R], [HV, R]: the prefill GEMMs' */
    float *g_bias, *A_log, *dt_bias, *onorm; /* [HV], [H], [HK], [V] */
    int kda_idx;       /* index among KDA layers (state offset) */
    /* GQA */
    float *q_norm, *k_norm; /* [hd] or NULL */
    float *mix_bias;   /* [n_mix]: q|gate|k|v biases (0 on the gate rows), or NULL (no qkv_bias) */
    float *o_bias;     /* [D] or NULL */
    int gqa_idx;       /* index among GQA layers (KV offset) */
} cu_layer;

typedef struct {
    backend base;
    const model_config *c;
    cp_dims d;
    cp_layout lo;
    kda_tuning tn;
    float eps;
    char devname[256];
    cudaStream_t st;           /* every launch, high priority */
    cudaStream_t st2;          /* a mixed step's decode rows' KDA step / attention beside st's prompt items */
    cudaEvent_t ev_fork, ev_join;
    int sms;                   /* multiprocessors */
    int prio_lo, prio_hi;      /* the device's stream priorities (st: hi, st2: lo) */
    cublasHandle_t cublas;
    kc_gemm_lt *glt;           /* tuned cublasLt plans (NULL: plain kc_gemm) */
    char *pool;                /* the one cudaMalloc, carved by lo */
    /* weights */
    cu_layer *lw;              /* [L] */
    uint16_t *embed, *lm_head; /* [vocab, D] (lm_head == embed when tied) */
    float *final_norm;         /* [D] */
    double *rope_inv;          /* [rope_dim / 2] RoPE frequencies (GQA models) */
    int kda_preconv;           /* KDA layers run kc_kda_conv before the step (GVA, conv_bias, no conv) */
    /* state and caches */
    float *state;              /* [max_seqs][slot_floats] */
    uint16_t *kv;              /* KV blocks */
    int32_t *d_table;          /* [max_seqs, max_blocks] device mirror of ka.table */
    int32_t *d_hist;           /* [max_seqs, max_seq_len] every token fed to each slot */
    kv_alloc ka;
    /* prefix snapshots: state slots in the pool, KV blocks by reference */
    float *snap_state;         /* [n_snaps][slot_floats] */
    int32_t *snap_blocks;      /* host [n_snaps][max_blocks] the KV blocks each snapshot references */
    int *snap_nb;              /* host [n_snaps] how many (0 = free) */
    int n_snaps_live;
    /* activations (device) */
    float *h, *proj, *q, *opart, *ml, *logits, *lse, *tlp, *lowrank;
    float *lowrank_dec;        /* [TM, HK + HV]: the side stream's low-rank outputs */
    uint16_t *xn, *act, *ybuf, *lowin;
    void *kda_ws, *attn_ws;    /* prefill kernels' workspaces */
    int fast_prefill;          /* prompt passes use the prefill kernels (tuning, and shapes they support) */
    int32_t *d_meta;           /* cp_meta arrays: CP_META_ARRAYS x TM for decode steps (the graphs
                                  capture these addresses), then CP_META_ARRAYS x PM for prompt passes */
    int32_t *h_meta;           /* pinned: the same two blocks, then the output buffers below */
    cp_meta dm, hm;            /* device / host views of the block in use (cu_use_meta) */
    cp_meta dm_dec, hm_dec, dm_pre, hm_pre;
    int meta_pre;              /* the prompt-pass block is in use */
    kc_sample_param *d_sp, *h_sp;
    kda_logit_bias *d_bias, *h_bias;
    int *d_scratch;
    int32_t *d_tok, *h_tok, *d_top, *h_top, *d_ptop, *h_ptop; /* sampled-row top-n; per-position top-n */
    float *d_lp, *h_lp, *d_toplp, *h_toplp, *d_ptoplp, *h_ptoplp, *h_tlp;
    float *h_rows;             /* pinned [CU_HOST_ROWS, vocab]: logits rows copied back */
    void *cublas_ws;
    /* step workspace (host), sized at create */
    int *row_item, *row_tok;   /* [PM] */
    int *done;                 /* [max_seqs] */
    step_item *split_items;    /* [max_seqs]: a mixed step's one-token items, then its chunks */
    /* outputs enqueued and not yet read back (cu_step_begin leaves the last
     * block's for cu_step_end) */
    struct { const step_item *items; const int *row_item, *row_tok; int n_out, active; } pend;
    /* decode graphs, one per bucket */
    cudaGraphExec_t graph[CP_N_BUCKETS];
    /* tuning prof=1: an event after each piece of work, the kind of work
     * since the previous event; folded into prof_ms when a step ends */
    int prof_on, prof_n, prof_steps;
    cudaEvent_t *prof_ev;      /* [CU_PROF_MAX] */
    unsigned char *prof_kind;  /* [CU_PROF_MAX] */
    double prof_ms[KDA_PROF_N];
} cuda_backend;

#define CU_PROF_MAX 8192
/* the work enqueued since the previous mark was of this kind */
void cu_prof_mark(cuda_backend *b, int kind);
/* after the stream is idle: fold the marks of this step into prof_ms */
void cu_prof_fold(cuda_backend *b);
#define PROF(b, kind)                                                                              \
    do {                                                                                           \
        if ((b)->prof_on) cu_prof_mark((b), (kind));                                               \
    } while (0)

#define CU_HOST_ROWS 32 /* logits rows copied to the host per round (all-logits / per-position top-n) */

/* cuda_weights.cu */
int cu_upload_weights(cuda_backend *b, const model_weights *W, char *err, size_t errlen);
/* cuda_forward.cu */
int cu_attn_split(const cuda_backend *b, int T);
/* the layers over T rows (decode kernels: per-token KDA, flash-decoding) */
int cu_forward(cuda_backend *b, int T, int n_items, int split, char *err, size_t errlen);
/* the same through the prefill kernels (chunked KDA, prefill attention) */
/* items [0, n_dec) of the pass are one-token items on rows [0, n_dec) */
int cu_forward_prefill(cuda_backend *b, int T, int n_items, int n_dec, int max_ctx, char *err, size_t errlen);
/* the GEMM rows of a prompt pass of T rows (tuning gemm_pad) */
int cu_gemm_rows(const cuda_backend *b, int T);
/* the MLP's gate|up GEMM output as bf16 (tuning gu_bf16; models with MLP biases keep fp32) */
static inline int cu_gu_bf16(const cuda_backend *b, const cu_layer *w) { return b->tn.gu_bf16 && !w->gu_bias; }
/* every prompt-pass GEMM shape once (load time); *n_shapes row counts; -7 on a device error */
int cu_prepare_prompt_gemms(cuda_backend *b, int *n_shapes);
/* final norm + lm-head of out rows [k0, k0 + n) into logits [n, vocab] (n <= TM) */
int cu_logits(cuda_backend *b, int k0, int n, char *err, size_t errlen);
/* cuda_step.cu */
void cu_use_meta(cuda_backend *b, int prefill); /* which block dm / hm view */
int cu_upload_meta(cuda_backend *b, char *err, size_t errlen);
int cu_step(backend *bb, const step_item *items, int n, char *err, size_t errlen);
/* the same in two halves: begin returns with the last outputs' copies enqueued, end waits and reads them */
int cu_step_begin(backend *bb, const step_item *items, int n, char *err, size_t errlen);
int cu_step_end(backend *bb, char *err, size_t errlen);

#endif
