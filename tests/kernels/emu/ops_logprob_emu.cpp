/* kernels/ops_logprob.cu (log-probs and top-n of logits rows) compiled as C++
 * for the CPU emulator (emu.cpp). */
#include "ops_logprob.cu"
