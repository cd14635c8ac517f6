/*
 * lab_kda_step_tiled.h - the kernel lab's column-tiled KDA step
 * (kda_step_tiled.cu). tile_occ: blocks per SM the kernel is compiled for,
 * 2 or 3; tile_clusters: at most this many persistent clusters (0 = as many
 * as fit), so that a test can make each cluster walk several work items.
 */
#ifndef KDA_LAB_KDA_STEP_TILED_H
#define KDA_LAB_KDA_STEP_TILED_H

#include "cuda_ops.h"

#ifdef __cplusplus
extern "C" {
#endif
int lab_kda_step_tiled(const kc_kda_args *a, int tile_occ, int tile_clusters, cudaStream_t s);
#ifdef __cplusplus
}
#endif
#endif
