#include "runtime/cuda/step_packing.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/device_sampling.h"

namespace kvrm::cuda {
namespace {

// Names what an error is about ("slot 3", "prefill chunk of slot 3 row 7"); formatted only when
// there is an error, so packing a good step never allocates.
struct What {
  bool prefill = false;
  int32_t slot = 0;
  int32_t row = -1;
};

std::string Describe(const What& w) {
  std::string s = absl::StrCat(w.prefill ? "prefill chunk of slot " : "slot ", w.slot);
  if (w.row >= 0) absl::StrAppend(&s, " row ", w.row);
  return s;
}

// Copies one run table into table `t` and fills its logical starts, from the end of its
// `dropped` released blocks; checks it against `limits` and checks that it holds `position`
// (the token the row writes).
absl::Status PackTable(const KvRun* runs, int32_t num_runs, int32_t dropped, int32_t position,
                       int32_t t, const StepInputLayout& l, const PackLimits& limits,
                       const What& what, int32_t* out) {
  if (num_runs < 1 || num_runs > l.max_runs) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(what), ".num_runs = ", num_runs, " outside [1, ", l.max_runs, "]"));
  }
  out[l.num_runs + t] = num_runs;
  int64_t start = int64_t{dropped} * limits.block_tokens;
  for (int32_t r = 0; r < num_runs; ++r) {
    const KvRun& run = runs[r];
    if (run.first_block < 0 || run.num_blocks < 1 ||
        int64_t{run.first_block} + run.num_blocks > limits.pool_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(Describe(what), ".runs[", r, "] = blocks [",
                                                     run.first_block, ", +", run.num_blocks,
                                                     ") outside the pool of ",
                                                     limits.pool_blocks, " blocks"));
    }
    const int64_t i = int64_t{t} * l.max_runs + r;
    out[l.run_first + i] = run.first_block;
    out[l.run_blocks + i] = run.num_blocks;
    out[l.run_start + i] = static_cast<int32_t>(start);
    start += int64_t{run.num_blocks} * limits.block_tokens;
  }
  if (position >= start) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(what), ": runs hold ", start,
                                                   " tokens, position ", position,
                                                   " has no block"));
  }
  return absl::OkStatus();
}

absl::Status CheckRow(int32_t token, int32_t position, const PackLimits& limits,
                      const What& what) {
  if (token < 0 || token >= limits.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(what), ".token = ", token, " outside [0, ", limits.vocab_size, ")"));
  }
  if (position < 0 || position >= limits.max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(what), ".position = ", position, " outside [0, ", limits.max_context, ")"));
  }
  return absl::OkStatus();
}

// The adapter an active row runs with, packed as 1 + slot (0: none).
absl::Status CheckAdapter(int32_t adapter, const PackLimits& limits, const What& what) {
  if (adapter < -1 || adapter >= limits.lora_adapters) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(what), ".adapter = ", adapter,
                                                   " outside [-1, ", limits.lora_adapters, ")"));
  }
  return absl::OkStatus();
}

// Released blocks (window release; far history is not computed here): only where every layer
// slides, and only blocks wholly behind the window of the table's first row, at `first`.
absl::Status CheckDropped(int32_t dropped, int32_t first, const PackLimits& limits,
                          const What& what) {
  if (dropped == 0) return absl::OkStatus();
  const int32_t behind = limits.release_window > 0
                             ? BlocksBehindWindow(first, limits.release_window, limits.block_tokens)
                             : 0;
  if (dropped > 0 && dropped <= behind) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      Describe(what), ".far_dropped = ", dropped, ": a row at position ", first, " reads all but ",
      behind,
      limits.release_window > 0 ? " blocks (behind its window)" : " (a layer without a window)"));
}

absl::Status CheckSampling(const DeviceSampling& p, const PackLimits& limits, const What& what) {
  absl::Status st = CheckDeviceSampling(p, limits.vocab_size);
  if (st.ok()) return st;
  return absl::InvalidArgumentError(absl::StrCat(Describe(what), ".", st.message()));
}

}  // namespace

StepInputLayout DecodeLayout(int32_t max_slots, int32_t max_runs) {
  return StepInputLayout::Make(max_slots, max_slots, max_runs);
}

StepInputLayout PrefillLayout(int32_t max_chunk, int32_t max_runs) {
  return StepInputLayout::Make(max_chunk, 1, max_runs);
}

StepInputLayout MixedLayout(int32_t max_slots, int32_t max_chunk, int32_t max_runs) {
  return StepInputLayout::Make(max_slots + max_chunk, max_slots + 1, max_runs);
}

namespace {

// The decode rows and tables [0, step.max_slots) of a zeroed buffer.
absl::Status PackDecodeRows(const StepDescriptor& step, const StepInputLayout& l,
                            const PackLimits& limits, int32_t* out, bool with_sampling) {
  for (int32_t s = 0; s < step.max_slots; ++s) {
    out[l.table + s] = s;
    if (!step.active[s]) continue;
    const What what{false, s, -1};
    const int32_t adapter = s < static_cast<int32_t>(step.adapter.size()) ? step.adapter[s] : -1;
    absl::Status st = CheckRow(step.token[s], step.position[s], limits, what);
    if (st.ok()) st = CheckAdapter(adapter, limits, what);
    const int32_t dropped =
        s < static_cast<int32_t>(step.far_dropped.size()) ? step.far_dropped[s] : 0;
    if (st.ok()) st = CheckDropped(dropped, step.position[s], limits, what);
    if (st.ok()) {
      st = PackTable(step.SlotRunsData(s), step.num_runs[s], dropped, step.position[s], s, l,
                     limits, what, out);
    }
    const bool sample = with_sampling && step.sampling[s].on_device;
    if (st.ok() && sample) st = CheckSampling(step.sampling[s], limits, what);
    if (!st.ok()) return st;
    out[l.active + s] = 1;
    out[l.token + s] = step.token[s];
    out[l.position + s] = step.position[s];
    out[l.adapter + s] = adapter + 1;
    if (sample) {
      const DeviceSampling& p = step.sampling[s];
      SamplingRow row;
      row.temperature = p.temperature;
      row.top_k = p.top_k;
      row.top_p = p.top_p;
      row.min_p = p.min_p;
      row.uniform = p.uniform;
      out[l.sample + s] = 1;
      std::memcpy(out + l.sample_params + int64_t{s} * kSamplingRowInts, &row, sizeof(row));
    }
  }
  return absl::OkStatus();
}

// The chunk's rows [first_row, first_row + n) of a zeroed buffer, all reading table `table`;
// last_row names the chunk's last row.
absl::Status PackChunkRows(const PrefillChunk& chunk, const StepInputLayout& l,
                           const PackLimits& limits, int32_t first_row, int32_t table,
                           int32_t* out) {
  const int64_t n = static_cast<int64_t>(chunk.tokens.size());
  const What what{true, chunk.slot, -1};
  if (chunk.start < 0) return absl::InvalidArgumentError(Describe(what) + ".start < 0");
  const int32_t last = chunk.start + static_cast<int32_t>(n) - 1;
  RETURN_IF_ERROR(CheckRow(0, last, limits, what));
  RETURN_IF_ERROR(CheckAdapter(chunk.adapter, limits, what));
  RETURN_IF_ERROR(CheckDropped(chunk.far_dropped, chunk.start, limits, what));
  RETURN_IF_ERROR(
      PackTable(chunk.runs, chunk.num_runs, chunk.far_dropped, last, table, l, limits, what, out));
  for (int64_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(CheckRow(chunk.tokens[i], chunk.start + static_cast<int32_t>(i), limits,
                             What{true, chunk.slot, static_cast<int32_t>(i)}));
    const int64_t row = first_row + i;
    out[l.active + row] = 1;
    out[l.token + row] = chunk.tokens[i];
    out[l.position + row] = chunk.start + static_cast<int32_t>(i);
    out[l.table + row] = table;
    out[l.adapter + row] = chunk.adapter + 1;
  }
  out[l.last_row] = first_row + static_cast<int32_t>(n - 1);
  return absl::OkStatus();
}

// Zeroes the whole buffer on an error: never a half-packed buffer behind.
absl::Status ZeroOnError(absl::Status st, const StepInputLayout& l, int32_t* out) {
  if (!st.ok()) std::fill(out, out + l.total, 0);
  return st;
}

}  // namespace

absl::Status PackDecodeInputs(const StepDescriptor& step, const StepInputLayout& l,
                              const PackLimits& limits, int32_t* out, bool with_sampling) {
  if (step.max_slots != l.rows || step.max_slots != l.tables || step.max_runs != l.max_runs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step descriptor shape [", step.max_slots, "][", step.max_runs,
        "] differs from the graph's [", l.rows, "][", l.max_runs, "]"));
  }
  std::fill(out, out + l.total, 0);
  return ZeroOnError(PackDecodeRows(step, l, limits, out, with_sampling), l, out);
}

absl::Status PackPrefillInputs(const PrefillChunk& chunk, const StepInputLayout& l,
                               const PackLimits& limits, int32_t* out) {
  const int64_t n = static_cast<int64_t>(chunk.tokens.size());
  if (n < 1 || n > l.rows || l.tables != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefill chunk of ", n, " tokens: the graph takes 1 to ", l.rows));
  }
  std::fill(out, out + l.total, 0);
  return ZeroOnError(PackChunkRows(chunk, l, limits, 0, 0, out), l, out);
}

absl::Status PackMixedInputs(const PrefillChunk& chunk, const StepDescriptor& step,
                             const StepInputLayout& l, const PackLimits& limits, int32_t* out,
                             bool with_sampling) {
  const int64_t n = static_cast<int64_t>(chunk.tokens.size());
  if (step.max_slots + 1 != l.tables || step.max_runs != l.max_runs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step descriptor shape [", step.max_slots, "][", step.max_runs,
        "] differs from the mixed graph's [", l.tables - 1, "][", l.max_runs, "]"));
  }
  if (n < 1 || n > l.rows - step.max_slots) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of ", n,
                                                   " tokens: the mixed graph takes 1 to ",
                                                   l.rows - step.max_slots));
  }
  if (chunk.slot >= 0 && chunk.slot < step.max_slots && step.active[chunk.slot]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefill chunk of slot ", chunk.slot, ": the slot also decodes in this step"));
  }
  std::fill(out, out + l.total, 0);
  absl::Status st = PackDecodeRows(step, l, limits, out, with_sampling);
  if (st.ok()) st = PackChunkRows(chunk, l, limits, step.max_slots, step.max_slots, out);
  return ZeroOnError(st, l, out);
}

bool AnyAdapterRow(const StepInputLayout& l, const int32_t* packed) {
  return std::any_of(packed + l.adapter, packed + l.adapter + l.rows,
                     [](int32_t a) { return a != 0; });
}

}  // namespace kvrm::cuda
