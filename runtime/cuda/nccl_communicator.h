// Tensor-parallel collectives between GPUs of one process through NCCL, behind the same
// Communicator interface the CPU ranks use (runtime/communicator.h).
//
// One communicator per rank (one rank per GPU), created together with ncclCommInitAll. The
// all-reduce only enqueues on the rank's compute stream, so it can be captured into the step
// graph; the buffer is device memory. A hang or an asynchronous NCCL error must not wedge the
// daemon: the backend's step wait polls AsyncError and, on an error or past its deadline, calls
// Abort, after which every call fails (the daemon reports the backend failed instead of hanging).
#ifndef KVRM_RUNTIME_CUDA_NCCL_COMMUNICATOR_H_
#define KVRM_RUNTIME_CUDA_NCCL_COMMUNICATOR_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/communicator.h"

namespace kvrm::cuda {

class NcclGroup {
 public:
  // One rank per entry of `devices` (CUDA device ordinals).
  static absl::StatusOr<std::unique_ptr<NcclGroup>> Create(const std::vector<int>& devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  // Rank r's endpoint; AllReduceSum(data, n) enqueues an in-place sum of n device floats on
  // `stream` (set before the first call, the rank's compute stream).
  Communicator* communicator(int rank) { return endpoints_[rank].get(); }
  void SetStream(int rank, cudaStream_t stream);
  // Rank `rank`'s part of an all-gather on its stream (capturable): recv[k * n + i] = rank k's
  // send[i], for n device floats per rank.
  absl::Status AllGather(int rank, const float* send, float* recv, int64_t n);

  // First asynchronous error of any rank's communicator (OK while none).
  absl::Status AsyncError() const;
  // Aborts every communicator (pending collectives return); later calls fail.
  void Abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  class Endpoint;
  NcclGroup() = default;
  std::vector<ncclComm_t> comms_;
  std::vector<std::unique_ptr<Communicator>> endpoints_;
  std::atomic<bool> aborted_{false};
  // Held by AsyncError's poll and by Abort: another rank's thread must not free the
  // communicators (ncclCommAbort) while one polls them.
  mutable std::mutex abort_mu_;
};

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_NCCL_COMMUNICATOR_H_
