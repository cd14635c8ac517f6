/* kernels/lab/skinny_gemm.cu (the lab's skinny decode GEMM) compiled as C++
 * for the CPU emulator (emu.cpp, which also holds kc_pdl_on: PDL is off there). */
#include "skinny_gemm.cu"
