// Process start-up and the MPI communicator.
//
// start_world() is the one place a process joins its job: started by an MPI launcher (mpirun,
// srun with PMIx or PMI) it initialises MPI and returns the world communicator; started
// without one it is a world of one and MPI is never initialised. A process that carries
// torchrun's WORLD_SIZE > 1 without a launcher, or a launcher's variables in a build without
// MPI, is refused: it would train the whole job alone. Everything after start-up talks to the
// Communicator interface only.
#pragma once

#include <memory>

#include "parallel/communicator.h"

namespace dhp {

std::unique_ptr<Communicator> start_world(int* argc, char*** argv);

// Whether an MPI launcher (mpirun, srun with PMIx or PMI) started this process: its
// environment holds the launcher's rank variables.
bool started_by_an_mpi_launcher();

}  // namespace dhp
