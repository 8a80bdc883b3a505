// Collective operations between the tensor-parallel ranks of one model replica.
//
// The interface NCCL implements on GPUs; on the CPU, InProcessCommunicatorGroup connects rank
// threads of one process through shared memory. Each rank owns one Communicator and calls it
// only from its rank thread; every rank must make the same sequence of calls (a collective).
#ifndef KVRM_RUNTIME_COMMUNICATOR_H_
#define KVRM_RUNTIME_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvrm {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[i] = sum over ranks of their data[i], for i < n; every rank passes the same n.
  // Deterministic: the sum is taken in rank order, so all ranks end with bit-identical values
  // and a rerun gives the same bits.
  virtual absl::Status AllReduceSum(float* data, int64_t n) = 0;
};

// Shared state of `size` in-process ranks; Communicator(r) is rank r's endpoint.
//
// AllReduceSum: every rank publishes its buffer and meets the others at a barrier; then rank r
// sums its slice of the elements across all buffers (in rank order) and writes the sum into
// every buffer; a second barrier ends the call. Barriers spin briefly, then yield: the ranks run
// in lockstep, so waits are short. No allocation per call.
class InProcessCommunicatorGroup {
 public:
  static absl::StatusOr<std::unique_ptr<InProcessCommunicatorGroup>> Create(int size);
  InProcessCommunicatorGroup(const InProcessCommunicatorGroup&) = delete;
  InProcessCommunicatorGroup& operator=(const InProcessCommunicatorGroup&) = delete;

  int size() const { return size_; }
  // Rank r's endpoint, owned by the group (which must outlive it).
  Communicator* communicator(int rank) { return endpoints_[rank].get(); }

 private:
  class Endpoint;
  explicit InProcessCommunicatorGroup(int size);
  // Sense-reversing barrier over all ranks; `sense` is the caller's local sense.
  void Barrier(bool* sense);
  absl::Status AllReduceSum(int rank, bool* sense, float* data, int64_t n);

  const int size_;
  std::vector<std::unique_ptr<Communicator>> endpoints_;  // [size] Endpoint objects
  std::vector<float*> buffers_;    // [size] published by each rank for the current call
  std::vector<int64_t> lengths_;   // [size] n of the current call, checked to agree
  alignas(64) std::atomic<int> arrived_{0};
  alignas(64) std::atomic<bool> global_sense_{false};
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_COMMUNICATOR_H_
