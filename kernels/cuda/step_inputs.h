// The static input buffer of a captured step graph: one int32 array per field at fixed offsets,
// so that one asynchronous copy of the packed host buffer is all a replay needs.
//
// Rows are the step's token rows: one per decode slot, or one per token of a prefill chunk.
// Each row names a run table; a decode step has one table per slot, a prefill chunk one table
// shared by its rows. Inactive rows (free slots, padding past a chunk's end) write no KV and
// produce zeros from attention, so a graph of fixed shape serves any mix of active rows.
//
// Plain C++ (no CUDA headers): the packing side (runtime/cuda/step_packing.h) and its tests build
// on machines without the toolkit; kernels include it too.
#ifndef KVRM_KERNELS_CUDA_STEP_INPUTS_H_
#define KVRM_KERNELS_CUDA_STEP_INPUTS_H_

#include <cstdint>

#if defined(__CUDACC__)
#define KVRM_HOST_DEVICE __host__ __device__
#else
#define KVRM_HOST_DEVICE
#endif

namespace kvrm::cuda {

// Each array starts on a 64-byte boundary (16 int32): coalesced loads, and a layout test can
// check offsets without knowing the packing order.
inline constexpr int64_t kStepInputAlignInts = 16;

// Per-row sampling parameters (the decode layout's sample_params, or any [rows] array).
struct SamplingRow {
  float temperature = 0;   // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;       // 0: off
  float top_p = 1;         // 1: off
  float min_p = 0;         // 0: off
  float repetition_penalty = 1;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  float uniform = 0;       // in [0, 1): the draw, from the request's own seeded generator
};
inline constexpr int64_t kSamplingRowInts = 8;
static_assert(sizeof(SamplingRow) == kSamplingRowInts * sizeof(int32_t),
              "SamplingRow is packed as 8 int32 words");

struct StepInputLayout {
  int32_t rows = 0;
  int32_t tables = 0;
  int32_t max_runs = 0;
  // Offsets in int32 elements from the buffer's start.
  int64_t active = 0;     // [rows] 1 = row computes and writes KV
  int64_t token = 0;      // [rows] input token
  int64_t position = 0;   // [rows] logical position of the token (attends to [0, position])
  int64_t table = 0;      // [rows] run table index
  int64_t num_runs = 0;   // [tables]
  int64_t run_first = 0;  // [tables][max_runs] physical id of the run's first block
  int64_t run_blocks = 0; // [tables][max_runs] blocks in the run
  int64_t run_start = 0;  // [tables][max_runs] logical token where the run starts
  int64_t last_row = 0;   // [1] the row whose logits a prefill chunk returns
  int64_t sample = 0;     // [rows] 1 = the step samples this row on the device
  int64_t sample_params = 0;  // [rows][kSamplingRowInts] the row's SamplingRow
  // [rows] 1 + the LoRA adapter slot the row runs with; 0: the base model (so padding and
  // inactive rows, all zeros, run none).
  int64_t adapter = 0;
  int64_t total = 0;      // int32 elements in the buffer

  static StepInputLayout Make(int32_t rows, int32_t tables, int32_t max_runs) {
    StepInputLayout l;
    l.rows = rows;
    l.tables = tables;
    l.max_runs = max_runs;
    int64_t at = 0;
    auto take = [&at](int64_t n) {
      const int64_t offset = at;
      at += (n + kStepInputAlignInts - 1) / kStepInputAlignInts * kStepInputAlignInts;
      return offset;
    };
    l.active = take(rows);
    l.token = take(rows);
    l.position = take(rows);
    l.table = take(rows);
    l.num_runs = take(tables);
    l.run_first = take(int64_t{tables} * max_runs);
    l.run_blocks = take(int64_t{tables} * max_runs);
    l.run_start = take(int64_t{tables} * max_runs);
    l.last_row = take(1);
    l.sample = take(rows);
    l.sample_params = take(int64_t{rows} * kSamplingRowInts);
    l.adapter = take(rows);
    l.total = at;
    return l;
  }
  int64_t bytes() const { return total * static_cast<int64_t>(sizeof(int32_t)); }
};

// Typed pointers into one buffer with a given layout (host staging or the device copy).
struct StepInputs {
  const int32_t* active = nullptr;
  const int32_t* token = nullptr;
  const int32_t* position = nullptr;
  const int32_t* table = nullptr;
  const int32_t* num_runs = nullptr;
  const int32_t* run_first = nullptr;
  const int32_t* run_blocks = nullptr;
  const int32_t* run_start = nullptr;
  const int32_t* last_row = nullptr;
  const int32_t* sample = nullptr;
  const SamplingRow* sample_params = nullptr;
  const int32_t* adapter = nullptr;
  int32_t rows = 0;
  int32_t max_runs = 0;

  static StepInputs At(const StepInputLayout& l, const int32_t* base) {
    StepInputs s;
    s.active = base + l.active;
    s.token = base + l.token;
    s.position = base + l.position;
    s.table = base + l.table;
    s.num_runs = base + l.num_runs;
    s.run_first = base + l.run_first;
    s.run_blocks = base + l.run_blocks;
    s.run_start = base + l.run_start;
    s.last_row = base + l.last_row;
    s.sample = base + l.sample;
    s.sample_params = reinterpret_cast<const SamplingRow*>(base + l.sample_params);
    s.adapter = base + l.adapter;
    s.rows = l.rows;
    s.max_runs = l.max_runs;
    return s;
  }

  // Physical token index of logical position `pos` in run table `t`, or -1 when no run holds it.
  KVRM_HOST_DEVICE int64_t PhysicalToken(int32_t t, int32_t pos, int32_t block_tokens) const {
    const int64_t base = static_cast<int64_t>(t) * max_runs;
    for (int32_t r = 0; r < num_runs[t]; ++r) {
      const int32_t start = run_start[base + r];
      const int32_t end = start + run_blocks[base + r] * block_tokens;
      if (pos >= start && pos < end) {
        return static_cast<int64_t>(run_first[base + r]) * block_tokens + (pos - start);
      }
    }
    return -1;
  }
};

}  // namespace kvrm::cuda

#endif  // KVRM_KERNELS_CUDA_STEP_INPUTS_H_
