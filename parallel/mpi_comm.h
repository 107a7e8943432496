// Process start-up and the MPI communicator.
//
// start_world() is the one place a process joins its job: with MPI it initialises MPI (a
// process started without a launcher is a singleton world of one) and returns the world
// communicator; built without MPI it returns a world of one. Everything after start-up talks
// to the Communicator interface only.
#pragma once

#include <memory>

#include "parallel/communicator.h"

namespace dhp {

std::unique_ptr<Communicator> start_world(int* argc, char*** argv);

}  // namespace dhp
