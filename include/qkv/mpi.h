// qkv/mpi.h — the process group of an MPI launch (mpirun -np N qkv ...),
// built when CMake finds MPI (QKV_MPI; docs/distributed.md). Only the qkv
// program links it; the library and the Python module know only
// qkv/process_group.h.
#pragma once

#include <memory>
#include <string>

#include "qkv/process_group.h"

namespace qkv {

// True when this process was started by an MPI launcher (mpirun, srun):
// its environment names a rank.
bool launched_by_mpi();

// The processes of this launch: MPI is initialised here and finalised when
// the group is destroyed. Called once, before any other thread is started.
std::unique_ptr<ProcessGroup> mpi_world(int& argc, char**& argv);

// The number of this launch's processes on this machine (1 outside MPI):
// each takes its share of the cores.
int mpi_local_size();

// The MPI library's name and version, as it says them (first line).
std::string mpi_library();

// Ends every process of the launch at once with `code` (after an error on
// one of them, so that none waits for it in a collective).
[[noreturn]] void mpi_abort(int code);

}  // namespace qkv
