/* kernels/ops_skinny.cu (the skinny decode GEMM) compiled as C++ for the CPU
 * emulator (emu.cpp, which also holds kc_pdl_on: PDL is off there). */
#include "ops_skinny.cu"
