// cuBLASLt, loaded when the first Gemm is made rather than when the process starts: the
// library's static initialisers took about 0.3 s of every process that links it, paid by every
// dhp command and every CUDA test case on machines where no device is ever used. Types and
// enums come from the header; the functions through this table.
#pragma once

#include <cublasLt.h>

namespace dhp::cuda {

struct CublasLtApi {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmul) matmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
};

// The table, loaded once (thread-safe) from the cuBLASLt of the major version dhp was built
// against; throws dhp::Error naming the library and the loader's reason when it cannot be
// loaded. The library stays loaded until the process ends.
const CublasLtApi& cublaslt();

}  // namespace dhp::cuda
