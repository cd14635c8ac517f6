/*
 * The prefix cache index (server/prefix_cache.c) on its own, with a fake
 * engine: longest-prefix lookups across edge splits, duplicate snapshots,
 * the echo outputs kept along paths (and what they are allowed to serve),
 * LRU eviction under a byte budget, and a random-operation model check
 * against brute force.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "prefix_cache.h"

/* the fake engine: which snapshot ids are live, and 1000 bytes each */
enum { MAX_SNAPS = 4096, SNAP_BYTES = 1000 };
static int live[MAX_SNAPS], n_live, n_dropped;

static void fake_drop(void *arg, int snap)
{
    (void)arg;
    assert_true(snap >= 0 && snap < MAX_SNAPS && live[snap]); /* never twice, never unknown */
    live[snap] = 0;
    n_live--;
    n_dropped++;
}

static size_t fake_bytes(void *arg)
{
    (void)arg;
    return (size_t)n_live * SNAP_BYTES;
}

static int new_snap(void)
{
    for (int i = 0; i < MAX_SNAPS; i++)
        if (!live[i]) {
            live[i] = 1;
            n_live++;
            return i;
        }
    fail_msg("fake engine full");
    return -1;
}

static pc_cache *cache(size_t budget)
{
    memset(live, 0, sizeof live);
    n_live = n_dropped = 0;
    pc_opts o = {.budget = budget, .drop = fake_drop, .engine_bytes = fake_bytes};
    pc_cache *c = pc_new(&o);
    assert_non_null(c);
    return c;
}

static void seq(int32_t *t, int n, int32_t base)
{
    for (int i = 0; i < n; i++) t[i] = base + i;
}

static void test_lookup_finds_the_longest_stored_prefix_across_splits(void **st)
{
    (void)st;
    pc_cache *c = cache(1 << 30);
    int32_t a[40], b[40];
    seq(a, 40, 100);
    memcpy(b, a, sizeof b);
    b[15] = 7; /* b shares 15 tokens with a */
    const int s20 = new_snap(), s10 = new_snap(), sb = new_snap();
    assert_int_equal(pc_store(c, a, 20, s20), 0);
    assert_int_equal(pc_store(c, a, 10, s10), 0);   /* splits the 20-token edge */
    assert_int_equal(pc_store(c, b, 30, sb), 0);    /* splits again at 15 */
    pc_match m = pc_lookup(c, a, 40, 39, -1);
    assert_int_equal(m.len, 20);
    assert_int_equal(m.snap, s20);
    assert_int_equal(m.shared, 20);
    m = pc_lookup(c, a, 40, 19, -1); /* capped: the 10-token one */
    assert_int_equal(m.len, 10);
    assert_int_equal(m.snap, s10);
    m = pc_lookup(c, b, 40, 39, -1);
    assert_int_equal(m.len, 30);
    assert_int_equal(m.snap, sb);
    /* diverging inside b's edge after 22 tokens: only the 10-token snapshot is a prefix */
    int32_t q[40];
    memcpy(q, b, sizeof q);
    q[22] = 9;
    m = pc_lookup(c, q, 40, 39, -1);
    assert_int_equal(m.len, 10);
    assert_int_equal(m.shared, 22);
    /* a prefix shorter than every snapshot, and a foreign one */
    m = pc_lookup(c, a, 5, 4, -1);
    assert_int_equal(m.len, 0);
    assert_int_equal(m.snap, -1);
    assert_int_equal(m.shared, 5);
    int32_t z[3] = {1, 2, 3};
    m = pc_lookup(c, z, 3, 2, -1);
    assert_int_equal(m.len + m.shared, 0);
    pc_stats s;
    pc_get_stats(c, &s);
    assert_int_equal(s.snaps, 3);
    assert_int_equal(s.nodes, 4); /* [0,10) [10,15) [15,20) of a, [15,30) of b */
    pc_free(c);
    assert_int_equal(n_live, 0); /* freeing the index gives every snapshot back */
}

static void test_a_second_snapshot_of_the_same_prefix_is_dropped(void **st)
{
    (void)st;
    pc_cache *c = cache(1 << 30);
    int32_t a[12];
    seq(a, 12, 1);
    const int first = new_snap(), second = new_snap();
    assert_int_equal(pc_store(c, a, 12, first), 0);
    assert_int_equal(pc_store(c, a, 12, second), 0);
    assert_false(live[second]);
    assert_true(live[first]);
    assert_int_equal(pc_lookup(c, a, 12, 12, -1).snap, first);
    pc_free(c);
}

/* Echo outputs live on the path: row q's data belongs to position q + 1 and
 * serves any prompt that has the same tokens through q + 1. A lookup for an
 * echo request counts only snapshots whose rows are all known with enough
 * alternatives; the first n of a stored longer list are the top n. */
static void test_echo_outputs_serve_only_prompts_that_share_them(void **st)
{
    (void)st;
    pc_cache *c = cache(1 << 30);
    enum { N = 30, K = 3 };
    int32_t p[N], q[N], ids[N * K], rids[N * K];
    float lps[N], tl[N * K], rl[N], rtl[N * K];
    seq(p, N, 50);
    memcpy(q, p, sizeof q);
    q[20] = 1; /* q shares 20 tokens */
    for (int r = 0; r < N; r++) {
        lps[r] = -0.5f * r;
        for (int k = 0; k < K; k++) ids[r * K + k] = r * 10 + k, tl[r * K + k] = -1.0f * k - r;
    }
    /* rows 0..9 in one step, 10..29 in the next (the last row has no next token: skipped) */
    assert_int_equal(pc_echo_write(c, p, N, 0, 10, lps, K, ids, tl), 0);
    assert_int_equal(pc_echo_write(c, p, N, 10, N, lps + 10, K, ids + 10 * K, tl + 10 * K), 0);
    const int s12 = new_snap(), s19 = new_snap(), s20 = new_snap();
    assert_int_equal(pc_store(c, p, 12, s12), 0);
    assert_int_equal(pc_store(c, p, 19, s19), 0);
    assert_int_equal(pc_store(c, p, 20, s20), 0);
    pc_match m = pc_lookup(c, p, N, N - 1, K);
    assert_int_equal(m.echo_ok, N - 1);
    assert_int_equal(m.len, 20);
    /* q: rows 0..18 are shared, row 19 predicts q[20] != p[20]: echo may use 19 at most */
    m = pc_lookup(c, q, N, N - 1, K);
    assert_int_equal(m.echo_ok, 19);
    assert_int_equal(m.len, 19);
    assert_int_equal(m.snap, s19);
    m = pc_lookup(c, q, N, N - 1, -1); /* no echo: the 20-token snapshot is fine */
    assert_int_equal(m.len, 20);
    /* read back: identical to what was written; 2 of the 3 alternatives */
    memset(rl, 0, sizeof rl);
    pc_echo_read(c, q, 19, 2, rl, rids, rtl);
    for (int r = 0; r < 19; r++) {
        assert_true(rl[r] == lps[r]);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(rids[r * 2 + k], ids[r * K + k]);
            assert_true(rtl[r * 2 + k] == tl[r * K + k]);
        }
    }
    /* a later record with fewer alternatives (a /score of the same prompt) keeps the richer one */
    assert_int_equal(pc_echo_write(c, p, N, 0, N, lps, 0, NULL, NULL), 0);
    assert_int_equal(pc_lookup(c, p, N, N - 1, K).echo_ok, N - 1);
    /* more alternatives than were recorded: nothing counts as known */
    m = pc_lookup(c, p, N, N - 1, K + 1);
    assert_int_equal(m.echo_ok, 0);
    assert_int_equal(m.len, 0);
    /* a prompt with unknown rows (recorded without echo) */
    int32_t u[N];
    seq(u, N, 900);
    const int su = new_snap();
    assert_int_equal(pc_store(c, u, 25, su), 0);
    assert_int_equal(pc_lookup(c, u, N, N - 1, 0).len, 0);
    assert_int_equal(pc_lookup(c, u, N, N - 1, -1).len, 25);
    pc_free(c);
}

/* Under a byte budget the least recently used leaves go first; a lookup is
 * a use; a snapshot with a descendant stays until the descendant is gone;
 * the index's own bytes count. */
static void test_eviction_is_lru_over_leaves_within_the_budget(void **st)
{
    (void)st;
    pc_cache *c = cache(1 << 30);
    int32_t t[5][50];
    int sn[5];
    for (int i = 0; i < 5; i++) {
        seq(t[i], 50, 1000 * (i + 1));
        sn[i] = new_snap();
        assert_int_equal(pc_store(c, t[i], 50, sn[i]), 0);
    }
    int32_t ext[60]; /* a child of t[0]: t[0]'s snapshot is now internal */
    memcpy(ext, t[0], sizeof t[0]);
    seq(ext + 50, 10, 7);
    const int se = new_snap();
    assert_int_equal(pc_store(c, ext, 60, se), 0);
    pc_lookup(c, t[1], 50, 50, -1); /* t[1] becomes the most recent */
    /* LRU leaves: t[2], t[3], t[4], then t[0]'s child ext, then t[0], then t[1] */
    const int order[] = {sn[2], sn[3], sn[4], se, sn[0], sn[1]};
    for (int k = 0; k < 6; k++) {
        assert_int_equal(pc_evict_one(c), 1);
        assert_false(live[order[k]]);
        for (int j = k + 1; j < 6; j++) assert_true(live[order[j]]);
    }
    assert_int_equal(pc_evict_one(c), 0);
    pc_stats s;
    pc_get_stats(c, &s);
    assert_int_equal(s.nodes, 0);
    assert_int_equal(s.index_bytes, 0);
    pc_free(c);

    /* a budget of 3 snapshots plus a little index: storing a 5th evicts down to it */
    c = cache(3 * SNAP_BYTES + 2000);
    for (int i = 0; i < 5; i++) {
        sn[i] = new_snap();
        assert_int_equal(pc_store(c, t[i], 50, sn[i]), 0);
        pc_trim(c);
        pc_get_stats(c, &s);
        assert_true(fake_bytes(NULL) + s.index_bytes <= 3 * SNAP_BYTES + 2000);
    }
    assert_int_equal(pc_lookup(c, t[4], 50, 50, -1).snap, sn[4]); /* the newest survive */
    assert_int_equal(pc_lookup(c, t[3], 50, 50, -1).snap, sn[3]);
    assert_int_equal(pc_lookup(c, t[0], 50, 50, -1).len, 0);
    pc_free(c);
    assert_int_equal(n_live, 0);
}

/* an echo output as a function of the path through position row + 1 (as
 * the model's numbers are): whoever records a path writes the same value */
static float path_value(const int32_t *q, int row)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i <= row + 1; i++) h = (h ^ (uint32_t)q[i]) * 16777619u;
    return (float)(h % 1000003u);
}

/* Random stores, lookups, evictions and echo writes against brute force:
 * a lookup's snapshot is live, its tokens are a prefix of the query no
 * longer than asked, and (with no eviction since) no longer stored prefix
 * exists; echo rows read back are the values of their own paths. */
static void test_random_operations_agree_with_brute_force(void **st)
{
    (void)st;
    enum { OPS = 4000, LEN = 24, VOCAB = 3 };
    pc_cache *c = cache((size_t)1 << 40);
    static int32_t stored[MAX_SNAPS][LEN];
    static int stored_len[MAX_SNAPS];
    uint64_t r = 5;
    int evicted_since = 0, echo_hits = 0, hits = 0;
    for (int it = 0; it < OPS; it++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        int32_t q[LEN];
        const int n = 2 + (int)(r >> 58) % (LEN - 1);
        uint64_t rr = r;
        for (int i = 0; i < n; i++) {
            rr = rr * 6364136223846793005ull + 1;
            q[i] = (int32_t)((rr >> 40) % VOCAB); /* a tiny vocabulary: many shared prefixes */
        }
        const int op = (int)(r >> 20) % 10;
        if (op < 4) {
            const int s = new_snap();
            memcpy(stored[s], q, (size_t)n * sizeof *q);
            stored_len[s] = n;
            assert_int_equal(pc_store(c, q, n, s), 0);
        } else if (op == 4) {
            evicted_since = 1;
            pc_evict_one(c);
        } else if (op == 5) { /* echo rows of q, in two steps */
            float lps[LEN];
            for (int row = 0; row + 1 < n; row++) lps[row] = path_value(q, row);
            const int cut = (n - 1) / 2;
            assert_int_equal(pc_echo_write(c, q, n, 0, cut, lps, 0, NULL, NULL), 0);
            assert_int_equal(pc_echo_write(c, q, n, cut, n, lps + cut, 0, NULL, NULL), 0);
        } else {
            const int max_len = 1 + (int)(r >> 36) % n;
            const pc_match m = pc_lookup(c, q, n, max_len, op == 9 ? 0 : -1);
            int best = 0;
            for (int s = 0; s < MAX_SNAPS; s++)
                if (live[s] && stored_len[s] <= max_len && !memcmp(stored[s], q, (size_t)stored_len[s] * sizeof *q) &&
                    stored_len[s] > best)
                    best = stored_len[s];
            if (m.len) {
                hits++;
                assert_true(live[m.snap]);
                assert_int_equal(stored_len[m.snap], m.len);
                assert_true(m.len <= max_len);
                assert_memory_equal(stored[m.snap], q, (size_t)m.len * sizeof *q);
            }
            if (op != 9 && !evicted_since) assert_int_equal(m.len, best);
            if (op == 9) {
                assert_true(m.len <= m.echo_ok);
                float lps[LEN];
                pc_echo_read(c, q, m.echo_ok, 0, lps, NULL, NULL);
                for (int row = 0; row < m.echo_ok; row++) assert_true(lps[row] == path_value(q, row));
                echo_hits += m.echo_ok > 0;
            }
        }
    }
    printf("%d hits, %d echo lookups with known rows\n", hits, echo_hits);
    assert_true(hits > 500 && echo_hits > 100);
    pc_free(c);
    assert_int_equal(n_live, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lookup_finds_the_longest_stored_prefix_across_splits),
        cmocka_unit_test(test_a_second_snapshot_of_the_same_prefix_is_dropped),
        cmocka_unit_test(test_echo_outputs_serve_only_prompts_that_share_them),
        cmocka_unit_test(test_eviction_is_lru_over_leaves_within_the_budget),
        cmocka_unit_test(test_random_operations_agree_with_brute_force),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
