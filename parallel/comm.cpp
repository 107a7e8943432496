#include "parallel/comm.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "kernels/check.h"

#ifdef DHP_MPI
#include <mpi.h>
#endif

namespace dhp {

#ifdef DHP_MPI
namespace {
void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw Error(fmt::format("MPI call {} failed: {}", what, std::string(msg, len)));
  }
}

template <class T>
void allreduce(T* data, int64_t n, MPI_Datatype type) {
  // MPI counts are int: reduce in slices so very large buffers work too.
  for (int64_t off = 0; off < n; off += INT_MAX / 2) {
    int count = int(std::min<int64_t>(n - off, INT_MAX / 2));
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + off, count, type, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce");
  }
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
}  // namespace

Comm::Comm(int* argc, char*** argv) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    mpi_check(MPI_Init(argc, argv), "MPI_Init");
    // MPI can be initialised once per process, so it is finalised at exit rather than when
    // this object goes: a later Comm (another run in the same process) still works.
    std::atexit(finalize_at_exit);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

Comm::~Comm() = default;

void Comm::allreduce_sum(float* data, int64_t n) const {
  if (size_ > 1) allreduce(data, n, MPI_FLOAT);
}
void Comm::allreduce_sum(double* data, int64_t n) const {
  if (size_ > 1) allreduce(data, n, MPI_DOUBLE);
}
void Comm::barrier() const {
  if (size_ > 1) MPI_Barrier(MPI_COMM_WORLD);
}
#else
Comm::Comm(int*, char***) {}
Comm::~Comm() = default;
void Comm::allreduce_sum(float*, int64_t) const {}
void Comm::allreduce_sum(double*, int64_t) const {}
void Comm::barrier() const {}
#endif

}  // namespace dhp
