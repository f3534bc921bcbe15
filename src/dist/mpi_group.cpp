// The process group of an MPI launch (qkv/mpi.h): sums with MPI_Allreduce and
// MPI_Iallreduce in place, broadcasts with MPI_Bcast, over MPI_COMM_WORLD.
#include "qkv/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <vector>

#include "qkv/error.h"

namespace qkv {
namespace {

// MPI counts are ints: a longer buffer goes in pieces.
constexpr int64_t kPiece = INT_MAX / 2;

class MpiGroup final : public ProcessGroup {
public:
  MpiGroup() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiGroup() override {
    wait_all();
    MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void sum(float* data, int64_t n) override { sum_now(data, n, MPI_FLOAT); }
  void sum(double* data, int64_t n) override { sum_now(data, n, MPI_DOUBLE); }
  void start_sum(float* data, int64_t n) override {
    for (int64_t at = 0; at < n; at += kPiece) {
      requests_.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, data + at, (int)std::min(kPiece, n - at), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                     &requests_.back());
    }
  }
  void poll() override {
    if (requests_.empty()) return;
    int done = 0;
    MPI_Testall((int)requests_.size(), requests_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) requests_.clear();
  }
  void wait_all() override {
    if (requests_.empty()) return;
    MPI_Waitall((int)requests_.size(), requests_.data(), MPI_STATUSES_IGNORE);
    requests_.clear();
  }
  void broadcast(void* data, size_t bytes, int root) override {
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes; at += kPiece)
      MPI_Bcast(p + at, (int)std::min<size_t>(kPiece, bytes - at), MPI_BYTE, root, MPI_COMM_WORLD);
  }

private:
  template <class T>
  void sum_now(T* data, int64_t n, MPI_Datatype type) {
    for (int64_t at = 0; at < n; at += kPiece)
      MPI_Allreduce(MPI_IN_PLACE, data + at, (int)std::min(kPiece, n - at), type, MPI_SUM, MPI_COMM_WORLD);
  }

  int rank_ = 0, size_ = 1;
  std::vector<MPI_Request> requests_;
};

}  // namespace

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(name)) return true;
  return false;
}

std::unique_ptr<ProcessGroup> mpi_world(int& argc, char**& argv) {
  int provided = 0;
  // FUNNELED: only the main thread calls MPI (the kernels' threads never do).
  QKV_CHECK(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
            "MPI: MPI_Init_thread failed");
  return std::make_unique<MpiGroup>();
}

int mpi_local_size() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return 1;
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int n = 1;
  MPI_Comm_size(local, &n);
  MPI_Comm_free(&local);
  return n;
}

std::string mpi_library() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string v(text, (size_t)length);
  return v.substr(0, v.find_first_of("\n,"));
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace qkv
