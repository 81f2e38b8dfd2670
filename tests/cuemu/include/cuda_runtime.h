/* tests/cuemu/include/cuda_runtime.h -- cuemu's stand-in for the CUDA
 * runtime header a .cu file includes: the host API (R's
 * <cuda_runtime_api.h>) plus the device side (cuemu.h: built-in types and
 * variables, intrinsics, launches).  C++ only. */
#ifndef RX_CUEMU_CUDA_RUNTIME_H
#define RX_CUEMU_CUDA_RUNTIME_H

#ifndef __cplusplus
#  error "cuemu: <cuda_runtime.h> is for the prep.sh'd C++ of a .cu file; C code includes <cuda_runtime_api.h>"
#endif

#include <cuda_runtime_api.h>

#include "cuemu.h"

/* cudaFuncSetAttribute (kernel, ...): the C++ overload is in
 * <cuda_runtime_api.h>. */

#endif
