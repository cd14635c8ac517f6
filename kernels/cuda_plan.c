/*
 * cuda_plan.c - the CUDA backend's host-side planner (see cuda_plan.h).
 */
#include "cuda_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* bytes of one kc_sample_param (cuda_ops.h) at most; the executor checks it */
#define CP_SAMPLE_PARAM_BYTES 128

int cp_dims_init(cp_dims *d, const model_config *c, const model_weights *w, int max_seqs, int max_seq_len,
                 int prefill_rows, int state_bf16, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->D = c->d, d->F = c->ffn, d->vocab = c->vocab, d->L = c->n_layers;
    d->H = c->kda_hv, d->K = c->kda_k, d->V = c->kda_v, d->taps = c->conv_size;
    d->HK = d->H * d->K, d->HV = d->H * d->V;
    d->Hqk = c->kda_h, d->QK = d->Hqk * d->K;
    d->Hq = c->gqa_h, d->Hkv = c->gqa_kvh, d->hd = c->gqa_hd, d->rope_dim = c->rope_dim;
    d->n_kda = model_n_kda_layers(c);
    d->n_gqa = model_n_gqa_layers(c);
    d->max_seqs = max_seqs, d->max_seq_len = max_seq_len;
    d->tied = w->lm_head.data == w->embed.data;
    for (int l = 0; l < c->n_layers; l++)
        if (c->kind[l] == KDA_LAYER_KDA) d->R = (int)w->layers[l].kda.f0.rows;
    /* shapes the kernels support */
    if (d->n_kda && (!(d->K == 16 || d->K == 32 || d->K == 64 || d->K == 128) || d->V > 128 || d->R > 256 ||
                     d->taps < 1 || d->taps > 4 || d->HV % 8 || !d->Hqk || d->H % d->Hqk)) {
        snprintf(err, errlen, "CUDA backend: unsupported KDA shape (K=%d V=%d rank=%d conv=%d)", d->K, d->V, d->R,
                 d->taps);
        return KDA_EUNSUP;
    }
    const int group = d->Hkv ? d->Hq / d->Hkv : 0;
    if (d->n_gqa && (!(d->hd == 16 || d->hd == 32 || d->hd == 64 || d->hd == 128) || d->Hq % d->Hkv ||
                     !(group == 1 || group == 2 || group == 4 || group == 8))) {
        snprintf(err, errlen, "CUDA backend: unsupported GQA shape (hd=%d Hq=%d Hkv=%d)", d->hd, d->Hq, d->Hkv);
        return KDA_EUNSUP;
    }
    if (d->D % 8 || d->F % 8) {
        snprintf(err, errlen, "CUDA backend: hidden and FFN sizes must be multiples of 8");
        return KDA_EUNSUP;
    }
    /* projection layouts: KDA [q | k | v | f0 | g0 | beta], GQA [q | gate | k | v] */
    d->kda_off_f0 = 2 * d->QK + d->HV;
    d->kda_off_g0 = d->kda_off_f0 + d->R;
    d->kda_off_beta = d->kda_off_g0 + d->R;
    d->kda_cols = d->kda_off_beta + d->H;
    d->gqa_off_q = 0;
    d->gqa_off_g = c->output_gate ? d->Hq * d->hd : -1;
    d->gqa_off_k = d->Hq * d->hd * (c->output_gate ? 2 : 1);
    d->gqa_off_v = d->gqa_off_k + d->Hkv * d->hd;
    d->gqa_cols = d->gqa_off_v + d->Hkv * d->hd;
    d->ldp = 2 * d->F; /* the MLP's gate|up output shares the buffer */
    if (d->n_kda && d->kda_cols > d->ldp) d->ldp = d->kda_cols;
    if (d->n_gqa && d->gqa_cols > d->ldp) d->ldp = d->gqa_cols;
    d->ldp = (d->ldp + 7) / 8 * 8;
    d->ycols = d->HV > d->Hq * d->hd ? d->HV : d->Hq * d->hd;
    int tm = 1;
    while (tm < max_seqs) tm <<= 1;
    d->TM = tm < 256 ? 256 : tm;
    d->PM = prefill_rows > d->TM ? prefill_rows : d->TM;
    d->max_blocks = (max_seq_len + KV_BLK - 1) / KV_BLK;
    d->kv_layer_elems = (size_t)2 * d->Hkv * KV_BLK * d->hd;
    d->block_elems = d->kv_layer_elems * d->n_gqa;
    /* rounded to 4 floats: the tiled KDA kernel moves the state in 16-byte units */
    d->state_bf16 = state_bf16 ? 1 : 0; /* S as bf16: half its floats (H*K*V is even: K is) */
    d->kda_layer_floats = (model_kda_layer_state_floats(c) / (d->state_bf16 ? 2 : 1) + model_kda_layer_tail_floats(c) +
                           3) & ~(size_t)3;
    d->slot_floats = d->kda_layer_floats * d->n_kda;
    const int nsplit256 = (max_seq_len + 255) / 256;
    d->rs_cap = d->TM * nsplit256 > 2048 ? d->TM * nsplit256 : 2048;
    return 0;
}

static size_t align_up(size_t x) { return (x + 255) & ~(size_t)255; }
/* next region of bytes at *off; returns its offset */
static size_t take(size_t *off, size_t bytes)
{
    const size_t at = *off;
    *off += align_up(bytes);
    return at;
}

void cp_layout_compute(cp_layout *lo, const cp_dims *d, const model_config *c, int n_blocks)
{
    memset(lo, 0, sizeof *lo);
    size_t o = 0;
    const size_t D = (size_t)d->D, F = (size_t)d->F, TM = (size_t)d->TM, PM = (size_t)d->PM;
    lo->embed = take(&o, (size_t)d->vocab * D * 2);
    lo->lm_head = d->tied ? lo->embed : take(&o, (size_t)d->vocab * D * 2);
    lo->final_norm = take(&o, D * 4);
    if (d->n_gqa) lo->rope_inv = take(&o, (size_t)(d->rope_dim / 2 + 1) * 8);
    for (int l = 0; l < d->L; l++) {
        cp_layer_off *w = &lo->layer[l];
        const int kda = c->kind[l] == KDA_LAYER_KDA;
        w->n_mix = kda ? d->kda_cols : d->gqa_cols;
        const size_t ycols = kda ? (size_t)d->HV : (size_t)d->Hq * d->hd;
        w->w_mix = take(&o, (size_t)w->n_mix * D * 2);
        w->w_o = take(&o, D * ycols * 2);
        w->w_gu = take(&o, 2 * F * D * 2);
        w->w_down = take(&o, D * F * 2);
        w->attn_norm = take(&o, D * 4);
        w->mlp_norm = take(&o, D * 4);
        if (c->mlp_bias) {
            w->gu_bias = take(&o, 2 * F * 4);
            w->down_bias = take(&o, D * 4);
        }
        if (kda) {
            w->convw = take(&o, (size_t)(2 * d->QK + d->HV) * d->taps * 4);
            if (c->conv_bias) w->conv_bias = take(&o, (size_t)(2 * d->QK + d->HV) * 4);
            w->f1t = take(&o, (size_t)d->R * d->HK * 2);
            w->g1t = take(&o, (size_t)d->R * d->HV * 2);
            w->g_bias = take(&o, (size_t)d->HV * 4);
            w->A_log = take(&o, (size_t)d->H * 4);
            w->dt_bias = take(&o, (size_t)d->HK * 4);
            w->onorm = take(&o, (size_t)d->V * 4);
            w->f1 = take(&o, (size_t)d->HK * d->R * 2);
            w->g1 = take(&o, (size_t)d->HV * d->R * 2);
        } else {
            if (c->qk_norm) {
                w->q_norm = take(&o, (size_t)d->hd * 4);
                w->k_norm = take(&o, (size_t)d->hd * 4);
            }
            if (c->qkv_bias) w->mix_bias = take(&o, (size_t)w->n_mix * 4);
            if (c->o_bias) w->o_bias = take(&o, D * 4);
        }
    }
    lo->weights_end = lo->weight_bytes = o;
    lo->state = take(&o, d->slot_floats * 4 * (size_t)d->max_seqs);
    lo->state_bytes = o - lo->state;
    lo->snap_state = take(&o, d->slot_floats * 4 * (size_t)d->n_snaps);
    lo->snap_bytes = o - lo->snap_state;
    const size_t mark = o;
    lo->h = take(&o, PM * D * 4);
    lo->proj = take(&o, PM * d->ldp * 4);
    lo->q = take(&o, PM * d->Hq * d->hd * 4 + 4);
    lo->lowrank = take(&o, PM * (d->HK + d->HV) * 4 + 4);
    lo->lowin = take(&o, PM * 2 * d->R * 2 + 4);
    lo->kda_ws = take(&o, d->kda_chunk_ws);
    lo->attn_ws = take(&o, d->attn_prefill_ws);
    lo->opart = take(&o, (size_t)d->rs_cap * d->Hq * d->hd * 4 + 4);
    lo->ml = take(&o, (size_t)d->rs_cap * d->Hq * 2 * 4 + 4);
    lo->logits = take(&o, TM * d->vocab * 4);
    lo->lse = take(&o, TM * 4);
    lo->tlp = take(&o, TM * 4);
    lo->xn = take(&o, PM * D * 2);
    lo->act = take(&o, PM * F * 2);
    lo->ybuf = take(&o, PM * d->ycols * 2);
    lo->meta = take(&o, (size_t)CP_META_ARRAYS * (TM + PM) * 4); /* a decode block, then a prefill block */
    lo->sample_params = take(&o, TM * CP_SAMPLE_PARAM_BYTES);
    lo->hist = take(&o, (size_t)d->max_seqs * d->max_seq_len * 4);
    lo->scratch = take(&o, TM * d->vocab * 4);
    lo->tok = take(&o, TM * 4);
    lo->lp = take(&o, TM * 4);
    lo->top = take(&o, TM * KDA_MAX_TOP * 4);
    lo->toplp = take(&o, TM * KDA_MAX_TOP * 4);
    lo->ptop = take(&o, TM * KDA_MAX_TOP * 4);
    lo->ptoplp = take(&o, TM * KDA_MAX_TOP * 4);
    lo->bias = take(&o, TM * KDA_MAX_LOGIT_BIAS * sizeof(kda_logit_bias));
    lo->table = take(&o, (size_t)d->max_seqs * d->max_blocks * 4);
    lo->cublas_ws = take(&o, CP_CUBLAS_WS);
    /* a mixed step's decode rows' low-rank outputs, written while the prompt
     * items' low-rank GEMMs fill lowrank (tuning mixed_reserve) */
    lo->lowrank_dec = take(&o, TM * (d->HK + d->HV) * 4 + 4);
    lo->act_bytes = o - mark;
    lo->act_end = o;
    lo->n_blocks = n_blocks;
    lo->kv_bytes = (size_t)n_blocks * d->block_elems * 2;
    lo->kv = take(&o, lo->kv_bytes + 16);
    lo->total = o;
}

int cp_layout_fit(cp_layout *lo, const cp_dims *d, const model_config *c, size_t budget, char *err, size_t errlen)
{
    cp_layout_compute(lo, d, c, 0);
    const size_t fixed = lo->total;
    if (fixed > budget) {
        snprintf(err, errlen,
                 "CUDA pool: weights %zu MiB + state %zu MiB + prefix snapshots %zu MiB + activations %zu MiB exceed "
                 "the budget of %zu MiB; lower --max-seqs or --prefix-cache-bytes, or raise the memory fraction",
                 lo->weight_bytes >> 20, lo->state_bytes >> 20, lo->snap_bytes >> 20, lo->act_bytes >> 20,
                 budget >> 20);
        return KDA_ENOMEM;
    }
    const size_t block_bytes = d->block_elems * 2;
    size_t nb = block_bytes ? (budget - fixed) / block_bytes : 0;
    const size_t want = (size_t)d->max_seqs * d->max_blocks;
    if (nb > want) nb = want;
    if (d->n_gqa && nb < (size_t)d->max_blocks) {
        snprintf(err, errlen, "CUDA pool: room for %zu KV blocks, one full-context sequence needs %d", nb,
                 d->max_blocks);
        return KDA_ENOMEM;
    }
    if (!d->n_gqa) nb = 0;
    cp_layout_compute(lo, d, c, (int)nb);
    while (lo->total > budget && nb > (size_t)d->max_blocks) /* alignment slack */
        cp_layout_compute(lo, d, c, (int)--nb);
    return 0;
}

void cp_meta_carve(cp_meta *m, int32_t *base, int PM)
{
    int32_t **f[CP_META_ARRAYS] = {&m->tok_ids,   &m->tok_pos,   &m->tok_slot, &m->item_row0, &m->item_ntok,
                                   &m->item_slot, &m->item_pos0, &m->out_rows, &m->lp_rows,  &m->lp_targets};
    for (int i = 0; i < CP_META_ARRAYS; i++) *f[i] = base + (size_t)i * PM;
}

/* ---- KV block allocator ---- */

int kv_alloc_init(kv_alloc *a, int n_blocks, int max_seqs, int max_blocks)
{
    memset(a, 0, sizeof *a);
    a->n_blocks = n_blocks, a->max_seqs = max_seqs, a->max_blocks = max_blocks;
    a->table = calloc((size_t)max_seqs * max_blocks + 1, sizeof *a->table);
    a->nblk = calloc((size_t)max_seqs, sizeof *a->nblk);
    a->free_list = malloc(((size_t)n_blocks + 1) * sizeof *a->free_list);
    a->seq_refs = calloc((size_t)n_blocks + 1, sizeof *a->seq_refs);
    a->snap_refs = calloc((size_t)n_blocks + 1, sizeof *a->snap_refs);
    if (!a->table || !a->nblk || !a->free_list || !a->seq_refs || !a->snap_refs) {
        kv_alloc_free(a);
        return KDA_ENOMEM;
    }
    /* block 0 comes out first */
    for (int i = 0; i < n_blocks; i++) a->free_list[i] = n_blocks - 1 - i;
    a->n_free = n_blocks;
    return 0;
}

void kv_alloc_free(kv_alloc *a)
{
    free(a->table), free(a->nblk), free(a->free_list), free(a->seq_refs), free(a->snap_refs);
    memset(a, 0, sizeof *a);
}

/* One reference less (from a slot when seq, else a snapshot); the block goes
 * back to the free list when it was the last. */
static void block_unref(kv_alloc *a, int32_t b, int seq)
{
    if (seq) {
        if (--a->seq_refs[b] == 0 && a->snap_refs[b] > 0) a->n_snap_only++;
    } else {
        if (--a->snap_refs[b] == 0 && a->seq_refs[b] == 0) a->n_snap_only--;
    }
    if (a->seq_refs[b] == 0 && a->snap_refs[b] == 0) a->free_list[a->n_free++] = b;
}

static void seq_ref(kv_alloc *a, int32_t b)
{
    if (a->seq_refs[b]++ == 0 && a->snap_refs[b] > 0) a->n_snap_only--;
}

int kv_alloc_reserve(kv_alloc *a, int slot, int n_tokens, int *first, int *last)
{
    const int want = (n_tokens + KV_BLK - 1) / KV_BLK;
    *first = *last = a->nblk[slot];
    if (want <= a->nblk[slot]) return 0;
    if (want > a->max_blocks || want - a->nblk[slot] > a->n_free) return KDA_ENOMEM;
    int32_t *row = a->table + (size_t)slot * a->max_blocks;
    while (a->nblk[slot] < want) {
        const int32_t b = a->free_list[--a->n_free];
        a->seq_refs[b] = 1;
        row[a->nblk[slot]++] = b;
    }
    *last = want;
    return 0;
}

void kv_alloc_release(kv_alloc *a, int slot)
{
    const int32_t *row = a->table + (size_t)slot * a->max_blocks;
    for (int i = 0; i < a->nblk[slot]; i++) block_unref(a, row[i], 1);
    a->nblk[slot] = 0;
}

int kv_alloc_used(const kv_alloc *a) { return a->n_blocks - a->n_free; }

int kv_alloc_snap_ref(kv_alloc *a, int slot, int n_tokens, int32_t *blocks)
{
    const int n = (n_tokens + KV_BLK - 1) / KV_BLK;
    const int32_t *row = a->table + (size_t)slot * a->max_blocks;
    for (int i = 0; i < n; i++) {
        const int32_t b = row[i];
        a->snap_refs[b]++;
        blocks[i] = b;
    }
    return n;
}

void kv_alloc_snap_unref(kv_alloc *a, const int32_t *blocks, int n)
{
    for (int i = 0; i < n; i++) block_unref(a, blocks[i], 0);
}

int kv_alloc_restore(kv_alloc *a, int slot, const int32_t *blocks, int n_tokens, int *copy_from, int *copy_to,
                     int *last)
{
    const int full = n_tokens / KV_BLK, partial = n_tokens % KV_BLK != 0;
    *copy_from = *copy_to = -1;
    *last = 0;
    if (partial && a->n_free == 0) return KDA_ENOMEM;
    int32_t *row = a->table + (size_t)slot * a->max_blocks;
    for (int i = 0; i < full; i++) {
        seq_ref(a, blocks[i]);
        row[i] = blocks[i];
    }
    a->nblk[slot] = full;
    if (partial) {
        const int32_t b = a->free_list[--a->n_free];
        a->seq_refs[b] = 1;
        row[a->nblk[slot]++] = b;
        *copy_from = blocks[full];
        *copy_to = b;
    }
    *last = a->nblk[slot];
    return 0;
}

/* ---- step packing ---- */

int cp_item_wants_row(const kda_batch_item *it, int t)
{
    if (it->want_all_logits || (it->targets && it->target_logprobs) ||
        (it->n_top > 0 && it->pos_top_ids && it->pos_top_logprobs))
        return 1;
    return t == it->n_tokens - 1 && (it->logits || it->sampling);
}

int cp_pack_decode(cp_meta *m, const step_item *items, int n, int graphs, int *bucket)
{
    int Tb = 1, bi = 0;
    while (Tb < n) Tb <<= 1, bi++;
    if (!graphs) Tb = n;
    for (int r = 0; r < Tb; r++) {
        const int real = r < n;
        m->tok_ids[r] = real ? items[r].it->tokens[0] : -1;
        m->tok_pos[r] = real ? items[r].pos : 0;
        m->tok_slot[r] = real ? items[r].slot : -1;
        m->item_row0[r] = r;
        m->item_ntok[r] = 1;
        m->item_slot[r] = real ? items[r].slot : -1;
        m->item_pos0[r] = m->tok_pos[r];
        m->out_rows[r] = r;
    }
    *bucket = bi;
    return Tb;
}

int cp_pack_pass(cp_meta *m, const step_item *items, int n, int *done, int PM, int *n_items, int *n_out,
                 int *max_ctx, int *row_item, int *row_tok)
{
    int T = 0, ni = 0, no = 0, ctx = 0;
    for (int i = 0; i < n && T < PM; i++) {
        const kda_batch_item *it = items[i].it;
        const int rem = it->n_tokens - done[i];
        if (rem <= 0) continue;
        const int take_n = rem < PM - T ? rem : PM - T;
        m->item_row0[ni] = T;
        m->item_ntok[ni] = take_n;
        m->item_slot[ni] = items[i].slot;
        m->item_pos0[ni] = items[i].pos + done[i];
        if (items[i].pos + done[i] + take_n > ctx) ctx = items[i].pos + done[i] + take_n;
        ni++;
        for (int k = 0; k < take_n; k++) {
            const int tk = done[i] + k;
            m->tok_ids[T + k] = it->tokens[tk];
            m->tok_pos[T + k] = items[i].pos + tk;
            m->tok_slot[T + k] = items[i].slot;
            if (cp_item_wants_row(it, tk)) {
                m->out_rows[no] = T + k;
                row_item[no] = i;
                row_tok[no] = tk;
                no++;
            }
        }
        done[i] += take_n;
        T += take_n;
    }
    *n_items = ni;
    *n_out = no;
    *max_ctx = ctx;
    return T;
}
