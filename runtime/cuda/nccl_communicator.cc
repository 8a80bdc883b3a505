#include "runtime/cuda/nccl_communicator.h"

#include "runtime/cuda/cuda_raii.h"

namespace kvrm::cuda {

class NcclGroup::Endpoint : public Communicator {
 public:
  Endpoint(NcclGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(float* data, int64_t n) override {
    if (group_->aborted()) return absl::UnavailableError("NCCL communicator was aborted");
    if (stream_ == nullptr) return absl::FailedPreconditionError("NCCL endpoint has no stream");
    KVRM_NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32,
                                            ncclSum, group_->comms_[rank_], stream_));
    return absl::OkStatus();
  }
  void set_stream(cudaStream_t s) { stream_ = s; }
  absl::Status AllGather(const float* send, float* recv, int64_t n) {
    if (group_->aborted()) return absl::UnavailableError("NCCL communicator was aborted");
    if (stream_ == nullptr) return absl::FailedPreconditionError("NCCL endpoint has no stream");
    KVRM_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat32,
                                            group_->comms_[rank_], stream_));
    return absl::OkStatus();
  }

 private:
  NcclGroup* const group_;
  const int rank_;
  cudaStream_t stream_ = nullptr;
};

absl::StatusOr<std::unique_ptr<NcclGroup>> NcclGroup::Create(const std::vector<int>& devices) {
  if (devices.size() < 2) return absl::InvalidArgumentError("NCCL group needs two or more GPUs");
  auto g = std::unique_ptr<NcclGroup>(new NcclGroup());
  g->comms_.resize(devices.size());
  KVRM_NCCL_RETURN_IF_ERROR(
      ncclCommInitAll(g->comms_.data(), static_cast<int>(devices.size()), devices.data()));
  for (int r = 0; r < static_cast<int>(devices.size()); ++r) {
    g->endpoints_.push_back(std::make_unique<Endpoint>(g.get(), r));
  }
  return g;
}

NcclGroup::~NcclGroup() {
  for (ncclComm_t c : comms_) {
    if (c == nullptr) continue;
    if (aborted()) continue;  // ncclCommAbort already freed it
    ncclCommDestroy(c);
  }
}

void NcclGroup::SetStream(int rank, cudaStream_t stream) {
  static_cast<Endpoint*>(endpoints_[rank].get())->set_stream(stream);
}

absl::Status NcclGroup::AllGather(int rank, const float* send, float* recv, int64_t n) {
  return static_cast<Endpoint*>(endpoints_[rank].get())->AllGather(send, recv, n);
}

absl::Status NcclGroup::AsyncError() const {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted()) return absl::UnavailableError("NCCL communicator was aborted");
  for (ncclComm_t c : comms_) {
    ncclResult_t async = ncclSuccess;
    KVRM_NCCL_RETURN_IF_ERROR(ncclCommGetAsyncError(c, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      return absl::InternalError(std::string("NCCL asynchronous error: ") +
                                 ncclGetErrorString(async));
    }
  }
  return absl::OkStatus();
}

void NcclGroup::Abort() {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.exchange(true, std::memory_order_acq_rel)) return;
  for (ncclComm_t c : comms_) {
    if (c != nullptr) ncclCommAbort(c);
  }
}

}  // namespace kvrm::cuda
