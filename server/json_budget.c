/* json_budget.c - see json_budget.h. Sizes come from malloc_usable_size, so
 * frees need no header of our own (glibc). */
#include "json_budget.h"

#include <cjson/cJSON.h>
#include <malloc.h>
#include <stdlib.h>

static _Thread_local struct {
    int armed, exceeded;
    size_t limit, held, peak;
} b;

static void *budget_malloc(size_t n)
{
    if (b.armed && b.limit && b.held + n > b.limit) {
        b.exceeded = 1;
        return NULL;
    }
    void *p = malloc(n);
    if (p && b.armed) {
        b.held += malloc_usable_size(p);
        if (b.held > b.peak) b.peak = b.held;
    }
    return p;
}

static void budget_free(void *p)
{
    if (!p) return;
    if (b.armed) {
        size_t n = malloc_usable_size(p);
        b.held = n < b.held ? b.held - n : 0;   /* allocated before arming: not counted */
    }
    free(p);
}

void json_budget_install(void)
{
    cJSON_Hooks h = {budget_malloc, budget_free};
    cJSON_InitHooks(&h);
}

void json_budget_arm(size_t limit)
{
    b.armed = 1;
    b.exceeded = 0;
    b.limit = limit;
    b.held = b.peak = 0;
}

size_t json_budget_disarm(void)
{
    b.armed = 0;
    return b.peak;
}

int json_budget_exceeded(void) { return b.exceeded; }
