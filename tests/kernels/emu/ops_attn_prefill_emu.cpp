/* kernels/ops_attn_prefill.cu (prompt-chunk attention) compiled as C++ for the
 * CPU emulator (emu.cpp). */
#include "ops_attn_prefill.cu"
