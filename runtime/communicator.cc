#include "runtime/communicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/thread_pool.h"

namespace kvrm {

class InProcessCommunicatorGroup::Endpoint : public Communicator {
 public:
  Endpoint(InProcessCommunicatorGroup* group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return group_->size(); }
  absl::Status AllReduceSum(float* data, int64_t n) override {
    return group_->AllReduceSum(rank_, &sense_, data, n);
  }

 private:
  InProcessCommunicatorGroup* const group_;
  const int rank_;
  bool sense_ = false;  // this rank's barrier sense; touched only by the rank thread
};

absl::StatusOr<std::unique_ptr<InProcessCommunicatorGroup>> InProcessCommunicatorGroup::Create(
    int size) {
  if (size < 1 || size > 64) {
    return absl::InvalidArgumentError(absl::StrCat("communicator size ", size, " not in [1, 64]"));
  }
  return std::unique_ptr<InProcessCommunicatorGroup>(new InProcessCommunicatorGroup(size));
}

InProcessCommunicatorGroup::InProcessCommunicatorGroup(int size)
    : size_(size), buffers_(size, nullptr), lengths_(size, 0) {
  for (int r = 0; r < size; ++r) endpoints_.push_back(std::make_unique<Endpoint>(this, r));
}

void InProcessCommunicatorGroup::Barrier(bool* sense) {
  *sense = !*sense;
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == size_ - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    global_sense_.store(*sense, std::memory_order_release);
    return;
  }
  for (int64_t i = 0; global_sense_.load(std::memory_order_acquire) != *sense; ++i) SpinPause(i);
}

absl::Status InProcessCommunicatorGroup::AllReduceSum(int rank, bool* sense, float* data,
                                                      int64_t n) {
  if (size_ == 1) return absl::OkStatus();
  buffers_[rank] = data;
  lengths_[rank] = n;
  Barrier(sense);
  // Every rank checks the same published lengths, so all agree on the outcome.
  for (int r = 0; r < size_; ++r) {
    if (lengths_[r] != n) {
      // Read before the barrier: past it, rank r may already publish its next call's length.
      const int64_t theirs = lengths_[r];
      Barrier(sense);
      return absl::InternalError(absl::StrCat("all-reduce length mismatch: rank ", rank,
                                              " has ", n, ", rank ", r, " has ", theirs));
    }
  }
  // This rank reduces its own slice of the elements; slices are disjoint, so no element is
  // written by two ranks.
  const int64_t begin = n * rank / size_, end = n * (rank + 1) / size_;
  if (size_ == 2) {
    float* __restrict a = buffers_[0];
    float* __restrict b = buffers_[1];
    for (int64_t i = begin; i < end; ++i) a[i] = b[i] = a[i] + b[i];
  } else {
    for (int64_t i = begin; i < end; ++i) {
      float s = buffers_[0][i];
      for (int r = 1; r < size_; ++r) s += buffers_[r][i];
      for (int r = 0; r < size_; ++r) buffers_[r][i] = s;
    }
  }
  Barrier(sense);
  return absl::OkStatus();
}

}  // namespace kvrm
