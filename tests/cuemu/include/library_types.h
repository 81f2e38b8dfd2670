/* tests/cuemu/include/library_types.h -- cuemu's stand-in for CUDA's
 * library_types.h: the data types of cublasGemmEx (CUDA 13 values). */
#ifndef CUEMU_LIBRARY_TYPES_H
#define CUEMU_LIBRARY_TYPES_H

typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14
} cudaDataType_t;
typedef enum cudaDataType_t cudaDataType;

#endif
