// meridian-train-mpi: meridian-train's very loop (same data order, model, buckets, DiLoCo
// step, output) with its collectives done by OpenMPI instead of Meridian, for the
// side-by-side comparison in bench/train_bench.sh. Bucket averages are MPI_Iallreduce
// started as backward produces them and waited for before the optimizer step, as Horovod
// or PyTorch's MPI backend would. Launch with mpirun; bf16 on the wire and hybrid sync are
// Meridian-only.
#include <mpi.h>

#include <memory>

#include "kernels/reduce.h"
#include "trainer/train_cli.h"

namespace meridian::trainer {
namespace {

using kernels::DataType;
using kernels::ReduceOp;

Result<MPI_Datatype> mpiType(DataType t) {
  switch (t) {
    case DataType::kF32: return MPI_FLOAT;
    case DataType::kF64: return MPI_DOUBLE;
    case DataType::kI32: return MPI_INT32_T;
    case DataType::kI64: return MPI_INT64_T;
    default: return invalidArgument("{} is not available over MPI here (use --wire f32 or int8)", kernels::toString(t));
  }
}

MPI_Op mpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProd: return MPI_PROD;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    default: return MPI_SUM;  // kSum, and kAvg (divided afterwards)
  }
}

Status mpiStatus(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return commError("{}: {}", what, std::string(text, static_cast<std::size_t>(len)));
}

class MpiSyncComm final : public SyncComm {
 public:
  MpiSyncComm() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  class Request final : public Pending {
   public:
    Request(void* data, std::size_t count, DataType type, bool average, int size, Status error)
        : data_(data), count_(count), type_(type), average_(average), size_(size), error_(std::move(error)) {}
    MPI_Request* handle() { return &req_; }
    Status wait() override {
      if (!error_.isOk()) return error_;
      MERIDIAN_RETURN_IF_ERROR(mpiStatus(MPI_Wait(&req_, MPI_STATUS_IGNORE), "MPI_Wait"));
      if (average_) kernels::divideBy(data_, count_, type_, size_);
      return Status();
    }

   private:
    MPI_Request req_ = MPI_REQUEST_NULL;
    void* data_;
    std::size_t count_;
    DataType type_;
    bool average_;
    int size_;
    Status error_;
  };

  std::unique_ptr<Pending> allreduceAsync(void* data, std::size_t count, DataType type, ReduceOp op) override {
    auto t = mpiType(type);
    auto req = std::make_unique<Request>(data, count, type, op == ReduceOp::kAvg, size_, t.status());
    if (t.isOk()) {
      Status st = mpiStatus(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), *t, mpiOp(op), MPI_COMM_WORLD,
                                           req->handle()),
                            "MPI_Iallreduce");
      if (!st.isOk()) return std::make_unique<Request>(data, count, type, false, size_, st);
    }
    return req;
  }
  Status allreduce(void* data, std::size_t count, DataType type, ReduceOp op) override {
    MERIDIAN_ASSIGN_OR_RETURN(MPI_Datatype t, mpiType(type));
    MERIDIAN_RETURN_IF_ERROR(mpiStatus(
        MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), t, mpiOp(op), MPI_COMM_WORLD), "MPI_Allreduce"));
    if (op == ReduceOp::kAvg) kernels::divideBy(data, count, type, size_);
    return Status();
  }
  Status allgather(const void* send, void* recv, std::size_t sendCount, DataType type) override {
    MERIDIAN_ASSIGN_OR_RETURN(MPI_Datatype t, mpiType(type));
    return mpiStatus(MPI_Allgather(send, static_cast<int>(sendCount), t, recv, static_cast<int>(sendCount), t,
                                   MPI_COMM_WORLD),
                     "MPI_Allgather");
  }
  Status barrier() override { return mpiStatus(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace
}  // namespace meridian::trainer

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = 0;
  {
    meridian::trainer::MpiSyncComm comm;
    rc = meridian::trainer::trainCli(argc, argv, &comm);
  }
  if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
  MPI_Finalize();
  return rc;
}
