/* kernels/ops_kda_chunk.cu compiled as C++ for the CPU emulator (emu.cpp). */
#include "ops_kda_chunk.cu"
