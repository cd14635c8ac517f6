/* kernels/ops_kda.cu (the KDA decode step kernels) compiled as C++ for the
 * CPU emulator (emu.cpp, which also holds kc_pdl_on: PDL is off there). */
#include "ops_kda.cu"
