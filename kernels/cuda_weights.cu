/*
 * cuda_weights.cu - weight upload and re-layout, once at create: every matrix
 * to bf16 in the pool regions the planner assigned (cuda_plan.c), the KDA
 * mixer's input projections stacked into one matrix [q|k|v|f0|g0|b] and the
 * GQA ones into [q|gate|k|v] (one GEMM each), F1 / G1 both transposed (for
 * the decode low-rank kernel) and as stored (for the prefill GEMMs), small
 * vectors as fp32. Conversion goes through a small host
 * staging buffer, a slice at a time.
 */
#include "cuda_internal.h"

static const char *tname(const tensor_view *t) { return t->name ? t->name : "?"; }

/* rows [r0, r0 + nrows) of t as bf16 to dst */
static int upload_rows(uint16_t *dst, const tensor_view *t, int64_t r0, int64_t nrows, uint16_t *stage, float *row,
                       char *err, size_t errlen)
{
    const int64_t cols = t->cols;
    for (int64_t r = 0; r < nrows; r++) {
        if (t->dtype == DT_BF16) {
            memcpy(stage + r * cols, tv_row(t, r0 + r), (size_t)cols * 2);
        } else {
            tv_row_f32(t, r0 + r, row);
            for (int64_t i = 0; i < cols; i++) stage[r * cols + i] = f32_to_bf16(row[i]);
        }
    }
    cudaError_t e = cudaMemcpy(dst, stage, (size_t)nrows * cols * 2, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "uploading %s: %s", tname(t), cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

/* One staging buffer for every upload (slices of SLICE rows, or one
 * transposed matrix), freed on every path by the caller. */
typedef struct {
    uint16_t *stage;
    float *row;
    size_t stage_elems, row_elems;
} stager;

static int stager_fit(stager *s, size_t elems, size_t row, const tensor_view *t, char *err, size_t errlen)
{
    if (elems > s->stage_elems) {
        free(s->stage);
        s->stage = (uint16_t *)malloc(elems * 2);
        s->stage_elems = s->stage ? elems : 0;
    }
    if (row > s->row_elems) {
        free(s->row);
        s->row = (float *)malloc(row * 4);
        s->row_elems = s->row ? row : 0;
    }
    if (!s->stage || !s->row) {
        snprintf(err, errlen, "out of host memory uploading %s", tname(t));
        return KDA_ENOMEM;
    }
    return 0;
}

#define SLICE 4096

static int upload_matrix(uint16_t *dst, const tensor_view *t, stager *sg, char *err, size_t errlen)
{
    for (int64_t r = 0; r < t->rows; r += SLICE) {
        const int64_t n = t->rows - r < SLICE ? t->rows - r : SLICE;
        int rc = stager_fit(sg, (size_t)n * t->cols, (size_t)t->cols, t, err, errlen);
        if (!rc) rc = upload_rows(dst + (size_t)r * t->cols, t, r, n, sg->stage, sg->row, err, errlen);
        if (rc) return rc;
    }
    return 0;
}

/* [rows, cols] view -> device [cols, rows] bf16 */
static int upload_transposed(uint16_t *dst, const tensor_view *t, stager *sg, char *err, size_t errlen)
{
    const int64_t R = t->rows, C = t->cols;
    int rc = stager_fit(sg, (size_t)R * C, (size_t)C, t, err, errlen);
    if (rc) return rc;
    for (int64_t r = 0; r < R; r++) {
        tv_row_f32(t, r, sg->row);
        for (int64_t c = 0; c < C; c++) sg->stage[c * R + r] = f32_to_bf16(sg->row[c]);
    }
    cudaError_t e = cudaMemcpy(dst, sg->stage, (size_t)R * C * 2, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "uploading %s: %s", tname(t), cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

/* fp32 vector/matrix of n floats; an absent tensor is filled with dflt */
static int upload_f32(float *dst, const tensor_view *t, size_t n, float dflt, stager *sg, char *err, size_t errlen)
{
    int rc = stager_fit(sg, 1, n, t, err, errlen);
    if (rc) return rc;
    float *v = sg->row;
    if (t && t->data) {
        for (int64_t r = 0; r < t->rows; r++) tv_row_f32(t, r, v + (size_t)r * t->cols);
    } else {
        for (size_t i = 0; i < n; i++) v[i] = dflt;
    }
    cudaError_t e = cudaMemcpy(dst, v, n * 4, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
        snprintf(err, errlen, "uploading %s: %s", t && t->name ? t->name : "a vector", cudaGetErrorString(e));
        return KDA_EDEVICE;
    }
    return 0;
}

static int upload_all(cuda_backend *b, const model_weights *W, stager *sg, char *err, size_t errlen)
{
    const model_config *c = b->c;
    const cp_dims *d = &b->d;
    const size_t D = (size_t)d->D;
    const tensor_view none = {}; /* an absent tensor: upload_f32 fills its default */
#define UP(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_) return rc_;                                                                       \
    } while (0)
    UP(upload_matrix(b->embed, &W->embed, sg, err, errlen));
    if (b->lm_head != b->embed) UP(upload_matrix(b->lm_head, &W->lm_head, sg, err, errlen));
    UP(upload_f32(b->final_norm, &W->final_norm, D, 1.0f, sg, err, errlen));
    if (b->rope_inv) { /* the frequencies config.c computed for the schedule (default / linear / llama3) */
        cudaError_t e = cudaMemcpy(b->rope_inv, c->rope_inv_freq, (size_t)(c->rope_dim / 2) * sizeof(double),
                                   cudaMemcpyHostToDevice);
        if (e != cudaSuccess) {
            snprintf(err, errlen, "uploading the RoPE frequencies: %s", cudaGetErrorString(e));
            return KDA_EDEVICE;
        }
    }
    for (int l = 0; l < c->n_layers; l++) {
        cu_layer *w = &b->lw[l];
        const layer_weights *lw = &W->layers[l];
        UP(upload_f32(w->attn_norm, &lw->attn_norm, D, 1.0f, sg, err, errlen));
        UP(upload_f32(w->mlp_norm, &lw->mlp_norm, D, 1.0f, sg, err, errlen));
        UP(upload_matrix(w->w_gu, &lw->mlp.gate, sg, err, errlen));
        UP(upload_matrix(w->w_gu + (size_t)d->F * D, &lw->mlp.up, sg, err, errlen));
        UP(upload_matrix(w->w_down, &lw->mlp.down, sg, err, errlen));
        if (w->gu_bias) {
            UP(upload_f32(w->gu_bias, &lw->mlp.gate_bias, (size_t)d->F, 0.0f, sg, err, errlen));
            UP(upload_f32(w->gu_bias + d->F, &lw->mlp.up_bias, (size_t)d->F, 0.0f, sg, err, errlen));
            UP(upload_f32(w->down_bias, &lw->mlp.down_bias, D, 0.0f, sg, err, errlen));
        }
        if (c->kind[l] == KDA_LAYER_KDA) {
            const kda_layer *k = &lw->kda;
            const size_t QK = (size_t)d->QK;
            UP(upload_matrix(w->w_mix, &k->q, sg, err, errlen));
            UP(upload_matrix(w->w_mix + QK * D, &k->k, sg, err, errlen));
            UP(upload_matrix(w->w_mix + 2 * QK * D, &k->v, sg, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)d->kda_off_f0 * D, &k->f0, sg, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)d->kda_off_g0 * D, &k->g0, sg, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)d->kda_off_beta * D, &k->b, sg, err, errlen));
            UP(upload_matrix(w->w_o, &k->o, sg, err, errlen));
            if (c->short_conv) {
                UP(upload_f32(w->convw, &k->q_conv, QK * d->taps, 0.0f, sg, err, errlen));
                UP(upload_f32(w->convw + QK * d->taps, &k->k_conv, QK * d->taps, 0.0f, sg, err, errlen));
                UP(upload_f32(w->convw + 2 * QK * d->taps, &k->v_conv, (size_t)d->HV * d->taps, 0.0f, sg, err,
                              errlen));
            }
            if (w->conv_bias) {
                UP(upload_f32(w->conv_bias, &k->q_conv_bias, QK, 0.0f, sg, err, errlen));
                UP(upload_f32(w->conv_bias + QK, &k->k_conv_bias, QK, 0.0f, sg, err, errlen));
                UP(upload_f32(w->conv_bias + 2 * QK, &k->v_conv_bias, (size_t)d->HV, 0.0f, sg, err, errlen));
            }
            UP(upload_transposed(w->f1t, &k->f1, sg, err, errlen));
            UP(upload_transposed(w->g1t, &k->g1, sg, err, errlen));
            UP(upload_matrix(w->f1, &k->f1, sg, err, errlen));
            UP(upload_matrix(w->g1, &k->g1, sg, err, errlen));
            UP(upload_f32(w->g_bias, &k->g1_bias, d->HV, 0.0f, sg, err, errlen));
            UP(upload_f32(w->A_log, &k->A_log, d->H, 0.0f, sg, err, errlen));
            UP(upload_f32(w->dt_bias, &k->dt_bias, d->HK, 0.0f, sg, err, errlen));
            UP(upload_f32(w->onorm, &k->o_norm, d->V, 1.0f, sg, err, errlen));
        } else {
            const gqa_layer *g = &lw->gqa;
            UP(upload_matrix(w->w_mix, &g->q, sg, err, errlen));
            if (c->output_gate) UP(upload_matrix(w->w_mix + (size_t)d->gqa_off_g * D, &g->gate, sg, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)d->gqa_off_k * D, &g->k, sg, err, errlen));
            UP(upload_matrix(w->w_mix + (size_t)d->gqa_off_v * D, &g->v, sg, err, errlen));
            UP(upload_matrix(w->w_o, &g->o, sg, err, errlen));
            if (c->qk_norm) {
                UP(upload_f32(w->q_norm, &g->q_norm, d->hd, 1.0f, sg, err, errlen));
                UP(upload_f32(w->k_norm, &g->k_norm, d->hd, 1.0f, sg, err, errlen));
            }
            if (w->mix_bias) { /* laid out like w_mix's rows: q | gate (no bias: 0) | k | v */
                const size_t QD = (size_t)d->Hq * d->hd, KD = (size_t)d->Hkv * d->hd;
                UP(upload_f32(w->mix_bias, &g->q_bias, QD, 0.0f, sg, err, errlen));
                if (c->output_gate) UP(upload_f32(w->mix_bias + d->gqa_off_g, &none, QD, 0.0f, sg, err, errlen));
                UP(upload_f32(w->mix_bias + d->gqa_off_k, &g->k_bias, KD, 0.0f, sg, err, errlen));
                UP(upload_f32(w->mix_bias + d->gqa_off_v, &g->v_bias, KD, 0.0f, sg, err, errlen));
            }
            if (w->o_bias) UP(upload_f32(w->o_bias, &g->o_bias, D, 0.0f, sg, err, errlen));
        }
    }
#undef UP
    return 0;
}

int cu_upload_weights(cuda_backend *b, const model_weights *W, char *err, size_t errlen)
{
    stager sg = {NULL, NULL, 0, 0};
    int rc = upload_all(b, W, &sg, err, errlen);
    free(sg.stage);
    free(sg.row);
    return rc;
}
