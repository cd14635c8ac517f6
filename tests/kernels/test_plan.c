/*
 * The CUDA backend's host-side planner (kernels/cuda_plan.c), without a GPU:
 * the pool layout, fitting it to a memory budget, the paged-KV block
 * allocator (including a full pool), and how steps are packed into rows.
 * Runs in CI on every build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cuda_plan.h"

/* the DM-KDAGQA-1.7B config (MODEL_SPEC 1) and weights as the binder would
 * describe them: only what the planner reads (f0 rows, tied head) */
static const char *cfg_17b =
    "{\"model_type\": \"kda\", \"hidden_size\": 2048, \"num_hidden_layers\": 24, \"num_heads\": 16,"
    " \"head_dim\": 128, \"expand_v\": 1, \"conv_size\": 4, \"intermediate_size\": 8064, \"vocab_size\": 32000,"
    " \"tie_word_embeddings\": true, \"max_position_embeddings\": 8192,"
    " \"attn\": {\"layers\": [3, 7, 11, 15, 19, 23], \"num_heads\": 16, \"num_kv_heads\": 4, \"head_dim\": 128,"
    " \"qk_norm\": true, \"rope_theta\": 1e7, \"partial_rotary_factor\": 0.25, \"output_gate\": true}}";

static model_config cfg;
static model_weights wts;
static layer_weights lws[KDA_MAX_LAYERS];
static const char embed_dummy = 0;

static int setup(void **st)
{
    (void)st;
    char err[256];
    if (config_parse(&cfg, cfg_17b, err, sizeof err)) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    memset(&wts, 0, sizeof wts);
    wts.layers = lws;
    wts.embed.data = wts.lm_head.data = &embed_dummy; /* tied */
    for (int l = 0; l < cfg.n_layers; l++) lws[l].kda.f0.rows = 128;
    return 0;
}

static void dims(cp_dims *d, int max_seqs, int max_len)
{
    char err[256];
    int rc = cp_dims_init(d, &cfg, &wts, max_seqs, max_len, 0, 0, err, sizeof err);
    if (rc) fail_msg("cp_dims_init: %s", err);
}

static void test_layout_regions_are_aligned_ordered_and_inside_the_pool(void **st)
{
    (void)st;
    cp_dims d;
    dims(&d, 64, 8192);
    cp_layout lo;
    cp_layout_compute(&lo, &d, &cfg, 1000);
    /* every region in carve order, each 256-byte aligned and after the previous */
    size_t offs[] = {lo.embed, lo.final_norm, lo.layer[0].w_mix, lo.layer[23].w_down, lo.state,
                     lo.h, lo.proj, lo.q, lo.lowrank, lo.opart, lo.ml, lo.logits, lo.lse, lo.tlp, lo.xn, lo.act,
                     lo.ybuf, lo.meta, lo.sample_params, lo.hist, lo.scratch, lo.tok, lo.lp, lo.top, lo.toplp,
                     lo.bias, lo.table, lo.cublas_ws, lo.lowrank_dec, lo.kv, lo.total};
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        assert_int_equal(offs[i] % 256, 0);
        if (i) assert_true(offs[i] > offs[i - 1]);
    }
    assert_true(lo.state == lo.weights_end && lo.kv == lo.act_end);
    assert_true(lo.lm_head == lo.embed); /* tied: no second copy */
    /* weights: the card's 1,664,776,224 parameters in bf16, plus the fp32
     * norms/gates/conv vectors (well under 1%) and alignment, plus the second
     * layout of the low-rank F1 / G1 (decode and prefill kernels read them
     * differently: 18 layers x 2 x [2048, 128] bf16) */
    const size_t P = 1664776224u, lowrank2 = (size_t)18 * 2 * 2048 * 128 * 2;
    assert_true(lo.weight_bytes >= 2 * P + lowrank2);
    assert_true(lo.weight_bytes <= 2 * P + lowrank2 + ((size_t)4 << 20));
    /* the state pool: per sequence 18 KDA layers x (1 MiB of fp32 state +
     * conv tails of 3 x (2048 q + 2048 k + 2048 v) fp32), MODEL_SPEC 3 */
    assert_int_equal(lo.state_bytes, (size_t)64 * 18 * (1048576 + 3 * 3 * 2048 * 4));
    /* KV: 12 KiB per token (MODEL_SPEC 4) */
    assert_int_equal(lo.kv_bytes, (size_t)1000 * KV_BLK * 12 * 1024);
    assert_true(lo.kv + lo.kv_bytes <= lo.total);
    /* pure: the same inputs give the same layout */
    cp_layout again;
    cp_layout_compute(&again, &d, &cfg, 1000);
    assert_memory_equal(&lo, &again, sizeof lo);
    /* prefix snapshots: n_snaps more state slots right after the sequences',
     * 19.3 MiB each (the whole KDA state of one sequence) */
    assert_int_equal(lo.snap_bytes, 0);
    d.n_snaps = 100;
    cp_layout ls;
    cp_layout_compute(&ls, &d, &cfg, 1000);
    assert_int_equal(ls.snap_state, lo.state + lo.state_bytes);
    assert_int_equal(ls.snap_bytes, (size_t)100 * 18 * (1048576 + 3 * 3 * 2048 * 4));
    assert_int_equal(ls.total - lo.total, ls.snap_bytes);
    assert_int_equal(ls.h, ls.snap_state + ls.snap_bytes);
}

static void test_fitting_the_pool_to_a_budget(void **st)
{
    (void)st;
    cp_dims d;
    dims(&d, 8, 8192);
    cp_layout lo;
    char err[512];
    /* less than the weights: refused, the message names what did not fit */
    assert_int_equal(cp_layout_fit(&lo, &d, &cfg, (size_t)1 << 30, err, sizeof err), KDA_ENOMEM);
    assert_non_null(strstr(err, "weights"));
    /* the fixed part fits but not one full-context sequence's KV */
    cp_layout_compute(&lo, &d, &cfg, 0);
    const size_t fixed = lo.total, block = d.block_elems * 2;
    assert_int_equal(cp_layout_fit(&lo, &d, &cfg, fixed + block * (d.max_blocks - 1), err, sizeof err), KDA_ENOMEM);
    assert_non_null(strstr(err, "full-context"));
    /* a budget for 3 full contexts: 3 x max_blocks blocks, total within budget */
    const size_t budget = fixed + block * 3 * (size_t)d.max_blocks + 4096;
    assert_int_equal(cp_layout_fit(&lo, &d, &cfg, budget, err, sizeof err), 0);
    assert_true(lo.total <= budget);
    assert_true(lo.n_blocks >= 3 * d.max_blocks - 1 && lo.n_blocks <= 3 * d.max_blocks);
    /* snapshot slots are part of the fixed part and named when it does not fit */
    d.n_snaps = 64;
    assert_int_equal(cp_layout_fit(&lo, &d, &cfg, fixed + 60 * d.slot_floats * 4, err, sizeof err), KDA_ENOMEM);
    assert_non_null(strstr(err, "prefix snapshots"));
    d.n_snaps = 0;
    /* a huge budget: capped at max_seqs full contexts */
    assert_int_equal(cp_layout_fit(&lo, &d, &cfg, (size_t)1 << 40, err, sizeof err), 0);
    assert_int_equal(lo.n_blocks, 8 * d.max_blocks);
}

static void test_kv_pool_full_refuses_and_takes_nothing(void **st)
{
    (void)st;
    kv_alloc a;
    assert_int_equal(kv_alloc_init(&a, 10, 4, 8), 0);
    int f, l;
    assert_int_equal(kv_alloc_reserve(&a, 0, 5 * KV_BLK, &f, &l), 0); /* 5 blocks */
    assert_int_equal(f, 0);
    assert_int_equal(l, 5);
    assert_int_equal(kv_alloc_reserve(&a, 1, 4 * KV_BLK + 1, &f, &l), 0); /* 5 more: pool exhausted */
    assert_int_equal(a.n_free, 0);
    int32_t table[4 * 8];
    memcpy(table, a.table, sizeof table);
    /* full: refused, nothing taken, nobody's table changes */
    assert_int_equal(kv_alloc_reserve(&a, 2, 1, &f, &l), KDA_ENOMEM);
    assert_int_equal(kv_alloc_reserve(&a, 0, 5 * KV_BLK + 1, &f, &l), KDA_ENOMEM);
    assert_int_equal(a.nblk[0], 5);
    assert_int_equal(a.nblk[2], 0);
    assert_memory_equal(table, a.table, sizeof table);
    /* growing within what is held needs nothing */
    assert_int_equal(kv_alloc_reserve(&a, 0, 5 * KV_BLK, &f, &l), 0);
    assert_int_equal(f, l);
    /* beyond one sequence's capacity: refused even with room */
    kv_alloc_release(&a, 1);
    assert_int_equal(kv_alloc_reserve(&a, 3, 9 * KV_BLK, &f, &l), KDA_ENOMEM);
    /* released blocks come back and are reused */
    assert_int_equal(a.n_free, 5);
    assert_int_equal(kv_alloc_reserve(&a, 2, 5 * KV_BLK, &f, &l), 0);
    assert_int_equal(kv_alloc_used(&a), 10);
    kv_alloc_free(&a);
}

static void test_kv_blocks_are_never_shared_under_random_use(void **st)
{
    (void)st;
    enum { NB = 200, SLOTS = 16, MAXB = 40 };
    kv_alloc a;
    assert_int_equal(kv_alloc_init(&a, NB, SLOTS, MAXB), 0);
    int want[SLOTS] = {0};
    uint64_t r = 7;
    for (int it = 0; it < 20000; it++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int s = (int)(r >> 33) % SLOTS, op = (int)(r >> 20) % 5;
        if (op == 0) {
            kv_alloc_release(&a, s);
            want[s] = 0;
        } else {
            const int n = want[s] + 1 + (int)(r >> 40) % 60;
            int f, l;
            const int free_before = a.n_free, held = a.nblk[s];
            const int rc = kv_alloc_reserve(&a, s, n, &f, &l);
            const int need = (n + KV_BLK - 1) / KV_BLK - held;
            if (rc == 0) {
                want[s] = n;
                assert_int_equal(a.n_free, free_before - (need > 0 ? need : 0));
            } else {
                assert_true(need > free_before || (n + KV_BLK - 1) / KV_BLK > MAXB);
                assert_int_equal(a.n_free, free_before);
                assert_int_equal(a.nblk[s], held);
            }
        }
        /* every block held by at most one slot, held + free = all */
        unsigned char owner[NB];
        memset(owner, 0, sizeof owner);
        int held = 0;
        for (int q = 0; q < SLOTS; q++)
            for (int b = 0; b < a.nblk[q]; b++) {
                const int id = a.table[q * MAXB + b];
                assert_true(id >= 0 && id < NB);
                assert_int_equal(owner[id], 0);
                owner[id] = 1;
                held++;
            }
        for (int k = 0; k < a.n_free; k++) {
            assert_int_equal(owner[a.free_list[k]], 0);
            owner[a.free_list[k]] = 1;
        }
        assert_int_equal(held + a.n_free, NB);
    }
    kv_alloc_free(&a);
}

/* Prefix snapshots share KV blocks with slots and with each other. Under
 * random appends, releases, snapshot takes / drops and restores, every holder
 * (slot or snapshot) must read back exactly the tokens of its own history at
 * every position it holds, the reference counts must match the holders, and
 * a block must be free exactly when nobody holds it. */
static void test_shared_kv_blocks_read_back_each_holders_own_tokens(void **st)
{
    (void)st;
    enum { NB = 120, SLOTS = 6, MAXB = 20, CAP = MAXB * KV_BLK, SNAPS = 10 };
    kv_alloc a;
    assert_int_equal(kv_alloc_init(&a, NB, SLOTS, MAXB), 0);
    static int32_t content[NB][KV_BLK];                   /* what each block row holds (a token stand-in) */
    static int32_t slot_hist[SLOTS][CAP], snap_tok[SNAPS][CAP], snap_blk[SNAPS][MAXB];
    int slot_len[SLOTS] = {0}, snap_len[SNAPS], snap_nb[SNAPS], snap_live[SNAPS] = {0};
    int restores = 0, partial_copies = 0, takes = 0;
    uint64_t r = 11;
    int32_t next_token = 1;
    for (int it = 0; it < 30000; it++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int s = (int)(r >> 33) % SLOTS, k = (int)(r >> 45) % SNAPS, op = (int)(r >> 20) % 8;
        if (op <= 2) { /* append 1..40 tokens */
            const int n = 1 + (int)(r >> 40) % 40, len = slot_len[s];
            int f, l;
            if (len + n > CAP || kv_alloc_reserve(&a, s, len + n, &f, &l)) continue;
            const int32_t *row = a.table + (size_t)s * MAXB;
            for (int p = len; p < len + n; p++) {
                slot_hist[s][p] = next_token;
                content[row[p / KV_BLK]][p % KV_BLK] = next_token++;
            }
            slot_len[s] = len + n;
        } else if (op == 3) {
            kv_alloc_release(&a, s);
            slot_len[s] = 0;
        } else if (op == 4 && slot_len[s] > 0 && !snap_live[k]) {
            snap_len[k] = slot_len[s];
            snap_nb[k] = kv_alloc_snap_ref(&a, s, snap_len[k], snap_blk[k]);
            assert_int_equal(snap_nb[k], (snap_len[k] + KV_BLK - 1) / KV_BLK);
            memcpy(snap_tok[k], slot_hist[s], (size_t)snap_len[k] * sizeof(int32_t));
            snap_live[k] = 1;
            takes++;
        } else if (op == 5 && snap_live[k]) {
            kv_alloc_snap_unref(&a, snap_blk[k], snap_nb[k]);
            snap_live[k] = 0;
        } else if (op >= 6 && snap_live[k]) { /* restore into slot s */
            kv_alloc_release(&a, s);
            slot_len[s] = 0;
            const int free_before = a.n_free;
            int from, to, last;
            const int rc = kv_alloc_restore(&a, s, snap_blk[k], snap_len[k], &from, &to, &last);
            if (rc) {
                assert_int_equal(a.n_free, 0);
                assert_int_equal(a.nblk[s], 0);
                continue;
            }
            assert_int_equal(last, snap_nb[k]);
            if (snap_len[k] % KV_BLK) { /* the partial block is a private copy */
                assert_true(from == snap_blk[k][snap_nb[k] - 1] && to != from);
                assert_int_equal(a.n_free, free_before - 1);
                memcpy(content[to], content[from], sizeof content[to]);
                partial_copies++;
            } else {
                assert_true(from == -1 && to == -1 && a.n_free == free_before);
            }
            memcpy(slot_hist[s], snap_tok[k], (size_t)snap_len[k] * sizeof(int32_t));
            slot_len[s] = snap_len[k];
            restores++;
        }
        /* every holder reads its own tokens */
        for (int q = 0; q < SLOTS; q++) {
            assert_true(a.nblk[q] >= (slot_len[q] + KV_BLK - 1) / KV_BLK);
            for (int p = 0; p < slot_len[q]; p++)
                assert_int_equal(content[a.table[q * MAXB + p / KV_BLK]][p % KV_BLK], slot_hist[q][p]);
        }
        for (int q = 0; q < SNAPS; q++)
            for (int p = 0; snap_live[q] && p < snap_len[q]; p++)
                assert_int_equal(content[snap_blk[q][p / KV_BLK]][p % KV_BLK], snap_tok[q][p]);
        /* reference counts are the holders; free exactly when unheld */
        int seq_refs[NB] = {0}, snap_refs[NB] = {0}, in_free[NB] = {0}, snap_only = 0;
        for (int q = 0; q < SLOTS; q++)
            for (int b = 0; b < a.nblk[q]; b++) seq_refs[a.table[q * MAXB + b]]++;
        for (int q = 0; q < SNAPS; q++)
            for (int b = 0; snap_live[q] && b < snap_nb[q]; b++) snap_refs[snap_blk[q][b]]++;
        for (int f = 0; f < a.n_free; f++) in_free[a.free_list[f]]++;
        for (int b = 0; b < NB; b++) {
            assert_int_equal(a.seq_refs[b], seq_refs[b]);
            assert_int_equal(a.snap_refs[b], snap_refs[b]);
            assert_int_equal(in_free[b], seq_refs[b] + snap_refs[b] == 0);
            snap_only += seq_refs[b] == 0 && snap_refs[b] > 0;
        }
        assert_int_equal(a.n_snap_only, snap_only);
    }
    printf("takes %d, restores %d (%d with a partial-block copy)\n", takes, restores, partial_copies);
    assert_true(takes > 500 && restores > 1000 && partial_copies > 500); /* the paths were exercised */
    for (int q = 0; q < SLOTS; q++) kv_alloc_release(&a, q);
    for (int q = 0; q < SNAPS; q++)
        if (snap_live[q]) kv_alloc_snap_unref(&a, snap_blk[q], snap_nb[q]);
    assert_int_equal(a.n_free, NB);
    assert_int_equal(a.n_snap_only, 0);
    kv_alloc_free(&a);
}

static void test_decode_steps_pad_to_their_graph_bucket(void **st)
{
    (void)st;
    int32_t buf[CP_META_ARRAYS * 256];
    cp_meta m;
    cp_meta_carve(&m, buf, 256);
    int32_t toks[5] = {10, 11, 12, 13, 14};
    kda_batch_item it[5];
    step_item si[5];
    for (int i = 0; i < 5; i++) {
        it[i] = (kda_batch_item){.seq = 4 - i, .tokens = &toks[i], .n_tokens = 1};
        si[i] = (step_item){.slot = 4 - i, .pos = 100 + i, .it = &it[i]};
    }
    int bucket = -1;
    assert_int_equal(cp_pack_decode(&m, si, 5, 1, &bucket), 8);
    assert_int_equal(bucket, 3);
    for (int r = 0; r < 8; r++) {
        const int real = r < 5;
        assert_int_equal(m.tok_ids[r], real ? 10 + r : -1);
        assert_int_equal(m.tok_slot[r], real ? 4 - r : -1); /* padding rows touch no state */
        assert_int_equal(m.item_slot[r], real ? 4 - r : -1);
        assert_int_equal(m.tok_pos[r], real ? 100 + r : 0);
        assert_int_equal(m.item_row0[r], r);
    }
    assert_int_equal(cp_pack_decode(&m, si, 5, 0, &bucket), 5); /* no graphs: no padding */
    assert_int_equal(cp_pack_decode(&m, si, 1, 1, &bucket), 1);
    assert_int_equal(bucket, 0);
}

static void test_prompt_chunks_are_cut_into_ordered_passes(void **st)
{
    (void)st;
    enum { TM = 256 };
    int32_t buf[CP_META_ARRAYS * TM];
    cp_meta m;
    cp_meta_carve(&m, buf, TM);
    const int lens[4] = {300, 1, 700, 5};
    int32_t *toks[4];
    float lp[1000];
    int32_t tg[1000];
    kda_batch_item it[4];
    step_item si[4];
    for (int i = 0; i < 4; i++) {
        toks[i] = malloc((size_t)lens[i] * sizeof(int32_t));
        for (int t = 0; t < lens[i]; t++) toks[i][t] = i * 1000 + t;
        it[i] = (kda_batch_item){.seq = i, .tokens = toks[i], .n_tokens = lens[i]};
        si[i] = (step_item){.slot = i, .pos = 10 * i, .it = &it[i]};
    }
    kda_sampling sp = {0};
    it[1].sampling = &sp;                                   /* wants its last row */
    it[2].targets = tg, it[2].target_logprobs = lp;         /* wants every row */
    for (int t = 0; t < 1000; t++) tg[t] = -1;
    int done[4] = {0}, next[4] = {0}, row_item[TM], row_tok[TM], passes = 0, outs = 0;
    for (;;) {
        int ni, no, ctx;
        const int T = cp_pack_pass(&m, si, 4, done, TM, &ni, &no, &ctx, row_item, row_tok);
        if (!T) break;
        passes++;
        assert_true(T <= TM);
        int rows = 0;
        for (int k = 0; k < ni; k++) {
            const int slot = m.item_slot[k];
            assert_int_equal(m.item_row0[k], rows); /* items packed back to back */
            assert_int_equal(m.item_pos0[k], 10 * slot + next[slot]);
            assert_true(ctx >= m.item_pos0[k] + m.item_ntok[k]);
            for (int j = 0; j < m.item_ntok[k]; j++) {
                const int r = rows + j;
                assert_int_equal(m.tok_slot[r], slot);
                assert_int_equal(m.tok_ids[r], slot * 1000 + next[slot]); /* in order, each token once */
                assert_int_equal(m.tok_pos[r], 10 * slot + next[slot]);
                next[slot]++;
            }
            rows += m.item_ntok[k];
        }
        assert_int_equal(rows, T);
        for (int k = 0; k < no; k++) {
            assert_int_equal(m.tok_slot[m.out_rows[k]], row_item[k]);
            assert_true(row_item[k] == 2 || (row_item[k] == 1 && row_tok[k] == 0));
        }
        outs += no;
    }
    for (int i = 0; i < 4; i++) assert_int_equal(next[i], lens[i]);
    assert_int_equal(passes, 4); /* 1006 tokens in passes of at most 256 */
    assert_int_equal(outs, 700 + 1);
    for (int i = 0; i < 4; i++) free(toks[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_regions_are_aligned_ordered_and_inside_the_pool),
        cmocka_unit_test(test_fitting_the_pool_to_a_budget),
        cmocka_unit_test(test_kv_pool_full_refuses_and_takes_nothing),
        cmocka_unit_test(test_kv_blocks_are_never_shared_under_random_use),
        cmocka_unit_test(test_shared_kv_blocks_read_back_each_holders_own_tokens),
        cmocka_unit_test(test_decode_steps_pad_to_their_graph_bucket),
        cmocka_unit_test(test_prompt_chunks_are_cut_into_ordered_passes),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
