#include "kernels/cuda/cublaslt_lib.h"

#include <dlfcn.h>

#include <string>

#include "core/check.h"

namespace dhp::cuda {
namespace {

#define DHP_STR2(x) #x
#define DHP_STR(x) DHP_STR2(x)
constexpr const char* kLibrary = "libcublasLt.so." DHP_STR(CUBLAS_VER_MAJOR);

template <class F>
void bind(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(::dlsym(lib, name));
  DHP_CHECK(fn != nullptr, "{} has no function {}: {}", kLibrary, name, ::dlerror());
}

CublasLtApi load() {
  void* lib = ::dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  DHP_CHECK(lib != nullptr, "cannot load {} (cuBLASLt, the CUDA backend's matrix products): {}",
            kLibrary, ::dlerror());
  CublasLtApi a{};
  bind(lib, a.create, "cublasLtCreate");
  bind(lib, a.destroy, "cublasLtDestroy");
  bind(lib, a.status_string, "cublasLtGetStatusString");
  bind(lib, a.matmul, "cublasLtMatmul");
  bind(lib, a.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(lib, a.desc_create, "cublasLtMatmulDescCreate");
  bind(lib, a.desc_destroy, "cublasLtMatmulDescDestroy");
  bind(lib, a.desc_set, "cublasLtMatmulDescSetAttribute");
  bind(lib, a.pref_create, "cublasLtMatmulPreferenceCreate");
  bind(lib, a.pref_destroy, "cublasLtMatmulPreferenceDestroy");
  bind(lib, a.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  bind(lib, a.layout_create, "cublasLtMatrixLayoutCreate");
  bind(lib, a.layout_destroy, "cublasLtMatrixLayoutDestroy");
  return a;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const CublasLtApi api = load();
  return api;
}

}  // namespace dhp::cuda
