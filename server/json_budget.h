/*
 * json_budget.h - a cap on the memory cJSON may hold for one request.
 *
 * cJSON builds a node (about 64 bytes) per array element, so a body of
 * "1,1,1,..." costs ~32x its size before anything can look at it. The cap is
 * per thread: an HTTP thread arms it around the parsing (and the small
 * endpoints' rendering) of one request; while armed, an allocation that would
 * take cJSON's live bytes over the cap fails, cJSON gives up cleanly, and the
 * caller sees json_budget_exceeded(). Unarmed threads (the scheduler, startup)
 * allocate as usual.
 */
#ifndef SRV_JSON_BUDGET_H
#define SRV_JSON_BUDGET_H

#include <stddef.h>

/* Routes cJSON's allocations through the budget; call once at startup. */
void json_budget_install(void);
/* limit 0: unlimited (counting only). */
void json_budget_arm(size_t limit);
/* Disarms; returns the peak bytes held while armed. */
size_t json_budget_disarm(void);
int json_budget_exceeded(void);

#endif
