#include "runtime/cuda/step_packing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/alloc_counter.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"

namespace kvrm::cuda {
namespace {

TEST(StepInputLayoutTest, ArraysAlignedDisjointAndInside) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 200; ++iter) {
    const int32_t rows = 1 + rng() % 300, tables = 1 + rng() % 300, runs = 1 + rng() % 40;
    const StepInputLayout l = StepInputLayout::Make(rows, tables, runs);
    struct Range { int64_t at, n; };
    std::vector<Range> ranges = {{l.active, rows},
                                 {l.token, rows},
                                 {l.position, rows},
                                 {l.table, rows},
                                 {l.num_runs, tables},
                                 {l.run_first, int64_t{tables} * runs},
                                 {l.run_blocks, int64_t{tables} * runs},
                                 {l.run_start, int64_t{tables} * runs},
                                 {l.last_row, 1},
                                 {l.sample, rows},
                                 {l.sample_params, int64_t{rows} * kSamplingRowInts},
                                 {l.adapter, rows}};
    std::sort(ranges.begin(), ranges.end(), [](Range a, Range b) { return a.at < b.at; });
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_EQ(ranges[i].at % kStepInputAlignInts, 0);
      EXPECT_LE(ranges[i].at + ranges[i].n, i + 1 < ranges.size() ? ranges[i + 1].at : l.total);
    }
    EXPECT_EQ(l.bytes(), l.total * 4);
  }
}

// A descriptor whose active slots own disjoint, fragmented run tables over a pool.
StepDescriptor RandomStep(std::mt19937& rng, int32_t slots, int32_t max_runs, int64_t pool,
                          int32_t block_tokens, int32_t vocab) {
  StepDescriptor d;
  d.Resize(slots, max_runs);
  std::vector<int32_t> blocks(pool);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  size_t next = 0;
  for (int32_t s = 0; s < slots; ++s) {
    if (rng() % 4 == 0) continue;  // a free slot
    const int32_t runs = 1 + rng() % max_runs;
    int32_t tokens = 0;
    for (int32_t r = 0; r < runs; ++r) {
      // A run is a block picked at random and the free blocks physically after it.
      const int32_t first = blocks[next++];
      int32_t n = 1;
      d.SlotRuns(s)[r] = KvRun{first, n};
      tokens += n * block_tokens;
    }
    d.num_runs[s] = runs;
    d.active[s] = 1;
    d.token[s] = rng() % vocab;
    d.position[s] = tokens - 1 - static_cast<int32_t>(rng() % block_tokens);
  }
  return d;
}

TEST(StepPackingTest, DecodeRowsResolveTokensLikeTheCpuRunTables) {
  std::mt19937 rng(11);
  const int32_t slots = 24, max_runs = 6, block_tokens = 16, vocab = 1000;
  const int64_t pool = 400;
  const PackLimits limits{pool, block_tokens, 4096, vocab};
  const StepInputLayout l = DecodeLayout(slots, max_runs);
  std::vector<int32_t> buf(l.total, -7);  // poisoned: packing must write every element
  for (int iter = 0; iter < 50; ++iter) {
    StepDescriptor d = RandomStep(rng, slots, max_runs, pool, block_tokens, vocab);
    ASSERT_TRUE(PackDecodeInputs(d, l, limits, buf.data()).ok());
    EXPECT_EQ(std::count(buf.begin(), buf.end(), -7), 0);
    const StepInputs in = StepInputs::At(l, buf.data());
    for (int32_t s = 0; s < slots; ++s) {
      EXPECT_EQ(in.table[s], s);
      EXPECT_EQ(in.active[s], d.active[s]);
      if (!d.active[s]) {
        EXPECT_EQ(in.num_runs[s], 0);
        EXPECT_EQ(in.position[s], 0);
        EXPECT_EQ(in.PhysicalToken(s, 0, block_tokens), -1);
        continue;
      }
      EXPECT_EQ(in.token[s], d.token[s]);
      EXPECT_EQ(in.position[s], d.position[s]);
      for (int32_t p = 0; p <= d.position[s]; ++p) {
        ASSERT_EQ(in.PhysicalToken(s, p, block_tokens),
                  PhysicalToken(d.SlotRunsData(s), d.num_runs[s], block_tokens, p))
            << "slot " << s << " position " << p;
      }
    }
    std::fill(buf.begin(), buf.end(), -7);
  }
}

// Window release: a table that lacks its first blocks (wholly behind the window of its row, a
// model whose every layer slides) is packed from their end, so every position from there on
// resolves to the block the CPU run table gives it, shifted by the released tokens, and the
// released positions to none. One block more than the window lets go, or any without a window,
// is refused naming the field.
TEST(StepPackingTest, ReleasedBlocksStartTheTableAfterThem) {
  std::mt19937 rng(5);
  const int32_t slots = 4, max_runs = 6, block_tokens = 16, vocab = 1000, window = 48;
  PackLimits limits{400, block_tokens, 4096, vocab};
  limits.release_window = window;
  const StepInputLayout l = DecodeLayout(slots, max_runs);
  std::vector<int32_t> buf(l.total);
  for (int iter = 0; iter < 20; ++iter) {
    StepDescriptor d = RandomStep(rng, slots, max_runs, 400, block_tokens, vocab);
    for (int32_t s = 0; s < slots; ++s) {
      if (!d.active[s]) continue;
      d.far_dropped[s] = BlocksBehindWindow(d.position[s], window, block_tokens);
    }
    ASSERT_TRUE(PackDecodeInputs(d, l, limits, buf.data()).ok());
    const StepInputs in = StepInputs::At(l, buf.data());
    for (int32_t s = 0; s < slots; ++s) {
      if (!d.active[s]) continue;
      const int64_t released = int64_t{d.far_dropped[s]} * block_tokens;
      for (int32_t p = 0; p <= d.position[s]; ++p) {
        ASSERT_EQ(in.PhysicalToken(s, p, block_tokens),
                  p < released
                      ? -1
                      : PhysicalToken(d.SlotRunsData(s), d.num_runs[s], block_tokens, p - released))
            << "slot " << s << " position " << p;
      }
    }
  }
  StepDescriptor d;
  d.Resize(slots, max_runs);
  d.active[1] = 1;
  d.token[1] = 3;
  d.position[1] = 100;  // reads [53, 100]: blocks 0..2 (tokens < 48) are behind
  d.num_runs[1] = 1;
  d.SlotRuns(1)[0] = KvRun{7, 4};
  d.far_dropped[1] = 3;
  EXPECT_TRUE(PackDecodeInputs(d, l, limits, buf.data()).ok());
  d.far_dropped[1] = 4;
  absl::Status st = PackDecodeInputs(d, l, limits, buf.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slot 1.far_dropped = 4"), absl::string_view::npos) << st;
  d.far_dropped[1] = 3;
  limits.release_window = 0;
  st = PackDecodeInputs(d, l, limits, buf.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("a layer without a window"), absl::string_view::npos) << st;
}

TEST(StepPackingTest, PackingAGoodStepDoesNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting is off under sanitizers";
  std::mt19937 rng(17);
  const int32_t slots = 64, max_runs = 8, block_tokens = 16;
  const PackLimits limits{2000, block_tokens, 4096, 32000};
  const StepInputLayout l = DecodeLayout(slots, max_runs);
  std::vector<int32_t> buf(l.total);
  StepDescriptor d = RandomStep(rng, slots, max_runs, 2000, block_tokens, 32000);
  const int64_t before = alloc_counter::AllocationCount();
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(PackDecodeInputs(d, l, limits, buf.data()).ok());
  EXPECT_EQ(alloc_counter::AllocationCount(), before);
}

TEST(StepPackingTest, BadDescriptorsNameSlotAndFieldAndLeaveZeros) {
  std::mt19937 rng(3);
  const int32_t slots = 8, max_runs = 4, block_tokens = 16, vocab = 100;
  const PackLimits limits{64, block_tokens, 512, vocab};
  const StepInputLayout l = DecodeLayout(slots, max_runs);
  std::vector<int32_t> buf(l.total);
  auto base = [&] {
    StepDescriptor d;
    d.Resize(slots, max_runs);
    d.active[5] = 1;
    d.token[5] = 42;
    d.position[5] = 20;
    d.num_runs[5] = 2;
    d.SlotRuns(5)[0] = KvRun{10, 1};
    d.SlotRuns(5)[1] = KvRun{30, 1};
    return d;
  };
  ASSERT_TRUE(PackDecodeInputs(base(), l, limits, buf.data()).ok());
  struct Case {
    void (*mutate)(StepDescriptor&);
    const char* field;
  };
  const Case cases[] = {
      {[](StepDescriptor& d) { d.token[5] = 100; }, "slot 5.token"},
      {[](StepDescriptor& d) { d.token[5] = -1; }, "slot 5.token"},
      {[](StepDescriptor& d) { d.position[5] = 512; }, "slot 5.position"},
      {[](StepDescriptor& d) { d.position[5] = 32; }, "position 32 has no block"},
      {[](StepDescriptor& d) { d.num_runs[5] = 0; }, "slot 5.num_runs"},
      {[](StepDescriptor& d) { d.num_runs[5] = 5; }, "slot 5.num_runs"},
      {[](StepDescriptor& d) {
         d.SlotRuns(5)[1] = KvRun{63, 2};
       },
       "slot 5.runs[1]"},
      {[](StepDescriptor& d) {
         d.SlotRuns(5)[0] = KvRun{-1, 1};
       },
       "slot 5.runs[0]"},
      {[](StepDescriptor& d) { d.far_dropped[5] = 1; }, "slot 5.far_dropped = 1"},
  };
  for (const Case& c : cases) {
    StepDescriptor d = base();
    c.mutate(d);
    std::fill(buf.begin(), buf.end(), 9);
    const absl::Status st = PackDecodeInputs(d, l, limits, buf.data());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(st.message().find(c.field), absl::string_view::npos) << st.message();
    EXPECT_EQ(std::count(buf.begin(), buf.end(), 0), l.total) << c.field;
  }
  StepDescriptor wrong;
  wrong.Resize(slots + 1, max_runs);
  EXPECT_EQ(PackDecodeInputs(wrong, l, limits, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StepPackingTest, SamplingRowsArePackedOnlyWhenAskedAndOnlyForActiveMarkedRows) {
  std::mt19937 rng(23);
  const int32_t slots = 16, max_runs = 4, block_tokens = 16, vocab = 500;
  const PackLimits limits{300, block_tokens, 1024, vocab};
  const StepInputLayout l = DecodeLayout(slots, max_runs);
  std::vector<int32_t> buf(l.total);
  StepDescriptor d = RandomStep(rng, slots, max_runs, 300, block_tokens, vocab);
  for (int32_t s = 0; s < slots; ++s) {
    DeviceSampling& p = d.sampling[s];
    p.on_device = s % 3 != 0;  // also marks some inactive rows: those must stay unsampled
    p.temperature = s % 2 ? 0.0f : 0.25f * s;
    p.top_k = s;
    p.top_p = 1.0f - 0.03f * s;
    p.min_p = 0.01f * s;
    p.uniform = 0.06f * s;
  }
  ASSERT_TRUE(PackDecodeInputs(d, l, limits, buf.data()).ok());
  EXPECT_EQ(std::count(buf.begin() + l.sample, buf.begin() + l.sample + slots, 1), 0)
      << "Decode (no sampling) packs no row for the device";
  ASSERT_TRUE(PackDecodeInputs(d, l, limits, buf.data(), /*with_sampling=*/true).ok());
  const StepInputs in = StepInputs::At(l, buf.data());
  int marked = 0;
  for (int32_t s = 0; s < slots; ++s) {
    const bool want = d.active[s] && d.sampling[s].on_device;
    ASSERT_EQ(in.sample[s], want ? 1 : 0) << "slot " << s;
    const SamplingRow& row = in.sample_params[s];
    if (!want) {
      EXPECT_EQ(row.temperature, 0.0f);
      EXPECT_EQ(row.uniform, 0.0f);
      continue;
    }
    ++marked;
    EXPECT_EQ(row.temperature, d.sampling[s].temperature);
    EXPECT_EQ(row.top_k, d.sampling[s].top_k);
    EXPECT_EQ(row.top_p, d.sampling[s].top_p);
    EXPECT_EQ(row.min_p, d.sampling[s].min_p);
    EXPECT_EQ(row.uniform, d.sampling[s].uniform);
    // No penalties on the device path: the kernel gets no penalty state.
    EXPECT_EQ(row.repetition_penalty, 1.0f);
    EXPECT_EQ(row.presence_penalty, 0.0f);
  }
  EXPECT_GT(marked, 4);

  // Out-of-range parameters name the slot and the field, and leave nothing packed.
  const int32_t s = static_cast<int32_t>(std::find(d.active.begin(), d.active.end(), 1) -
                                         d.active.begin());
  d.sampling[s] = DeviceSampling{1, 0.7f, 0, 1.0f, 0.0f, 0.5f};
  ASSERT_TRUE(PackDecodeInputs(d, l, limits, buf.data(), true).ok());
  struct Case {
    void (*mutate)(DeviceSampling&);
    const char* field;
  };
  const Case cases[] = {
      {[](DeviceSampling& p) { p.temperature = -1; }, "sampling.temperature"},
      {[](DeviceSampling& p) { p.temperature = std::nanf(""); }, "sampling.temperature"},
      {[](DeviceSampling& p) { p.top_k = 501; }, "sampling.top_k"},
      {[](DeviceSampling& p) { p.top_p = 0; }, "sampling.top_p"},
      {[](DeviceSampling& p) { p.min_p = 1.5f; }, "sampling.min_p"},
      {[](DeviceSampling& p) { p.uniform = 1.0f; }, "sampling.uniform"},
  };
  for (const Case& c : cases) {
    StepDescriptor bad = d;
    c.mutate(bad.sampling[s]);
    const absl::Status st = PackDecodeInputs(bad, l, limits, buf.data(), true);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(st.message().find(absl::StrCat("slot ", s, ".", c.field)), absl::string_view::npos)
        << st.message();
    EXPECT_EQ(std::count(buf.begin(), buf.end(), 0), l.total) << c.field;
    // Without sampling the same descriptor packs: the parameters are not read.
    EXPECT_TRUE(PackDecodeInputs(bad, l, limits, buf.data()).ok()) << c.field;
  }
}

TEST(StepPackingTest, PrefillChunkRowsShareOneTableAndPadInactive) {
  const int32_t chunk = 32, max_runs = 4, block_tokens = 16;
  const PackLimits limits{64, block_tokens, 1024, 500};
  const StepInputLayout l = PrefillLayout(chunk, max_runs);
  std::vector<int32_t> tokens(19);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(7 * i + 3);
  const KvRun runs[] = {{40, 2}, {5, 1}};
  PrefillChunk c;
  c.slot = 3;
  c.start = 27;
  c.tokens = tokens;
  c.runs = runs;
  c.num_runs = 2;
  std::vector<int32_t> buf(l.total, -1);
  ASSERT_TRUE(PackPrefillInputs(c, l, limits, buf.data()).ok());
  const StepInputs in = StepInputs::At(l, buf.data());
  EXPECT_EQ(in.last_row[0], 18);
  for (int32_t i = 0; i < chunk; ++i) {
    EXPECT_EQ(in.table[i], 0);
    EXPECT_EQ(in.active[i], i < 19 ? 1 : 0);
    if (i < 19) {
      EXPECT_EQ(in.token[i], tokens[i]);
      EXPECT_EQ(in.position[i], 27 + i);
      EXPECT_EQ(in.PhysicalToken(0, 27 + i, block_tokens),
                PhysicalToken(runs, 2, block_tokens, 27 + i));
    }
  }
  // Positions 27..48: position 48 is past the 48 tokens the runs hold, so the chunk is refused.
  tokens.resize(22);
  c.tokens = tokens;
  EXPECT_EQ(PackPrefillInputs(c, l, limits, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  tokens.assign(33, 1);  // more rows than the graph has
  c.tokens = tokens;
  c.start = 0;
  EXPECT_EQ(PackPrefillInputs(c, l, limits, buf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Released blocks (window release): this backend reads every block from the first.
  tokens.assign(4, 1);
  c.tokens = tokens;
  c.far_dropped = 1;
  const absl::Status released = PackPrefillInputs(c, l, limits, buf.data());
  EXPECT_EQ(released.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(released.message().find("far_dropped = 1"), absl::string_view::npos)
      << released.message();
}

// A mixed step is the decode step's packing plus the chunk's rows after it: the same decode rows
// (and sampling) as PackDecodeInputs, the chunk's rows resolving through their own table as
// PackPrefillInputs does, and last_row pointing into the combined rows.
TEST(StepPackingTest, MixedStepIsTheDecodeRowsThenTheChunkRows) {
  std::mt19937 rng(31);
  const int32_t slots = 12, chunk = 24, max_runs = 5, block_tokens = 16, vocab = 700;
  const int64_t pool = 500;
  const PackLimits limits{pool, block_tokens, 2048, vocab};
  const StepInputLayout dl = DecodeLayout(slots, max_runs);
  const StepInputLayout ml = MixedLayout(slots, chunk, max_runs);
  EXPECT_EQ(ml.rows, slots + chunk);
  EXPECT_EQ(ml.tables, slots + 1);
  std::vector<int32_t> dbuf(dl.total), mbuf(ml.total, -7);
  for (int iter = 0; iter < 20; ++iter) {
    StepDescriptor d = RandomStep(rng, slots, max_runs, pool, block_tokens, vocab);
    for (int32_t s = 0; s < slots; ++s) {
      d.sampling[s] = DeviceSampling{static_cast<uint8_t>(s % 2), 0.5f, 3, 0.9f, 0.0f, 0.25f};
    }
    int32_t free_slot = -1;
    for (int32_t s = 0; s < slots && free_slot < 0; ++s) {
      if (!d.active[s]) free_slot = s;
    }
    if (free_slot < 0) d.active[free_slot = 0] = 0;
    // The chunk's table (packing checks bounds, not that tables are disjoint).
    const KvRun runs[] = {{400, 2}, {450, 3}};
    std::vector<int32_t> tokens(1 + rng() % chunk);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % vocab);
    PrefillChunk c;
    c.slot = free_slot;
    c.start = static_cast<int32_t>(rng() % 40);
    c.tokens = tokens;
    c.runs = runs;
    c.num_runs = 2;
    ASSERT_TRUE(PackMixedInputs(c, d, ml, limits, mbuf.data(), true).ok());
    EXPECT_EQ(std::count(mbuf.begin(), mbuf.end(), -7), 0);
    ASSERT_TRUE(PackDecodeInputs(d, dl, limits, dbuf.data(), true).ok());
    const StepInputs m = StepInputs::At(ml, mbuf.data()), o = StepInputs::At(dl, dbuf.data());
    for (int32_t s = 0; s < slots; ++s) {
      EXPECT_EQ(m.active[s], o.active[s]);
      EXPECT_EQ(m.token[s], o.token[s]);
      EXPECT_EQ(m.position[s], o.position[s]);
      EXPECT_EQ(m.table[s], s);
      EXPECT_EQ(m.sample[s], o.sample[s]);
      EXPECT_EQ(m.sample_params[s].uniform, o.sample_params[s].uniform);
      for (int32_t p = 0; d.active[s] && p <= d.position[s]; ++p) {
        ASSERT_EQ(m.PhysicalToken(s, p, block_tokens), o.PhysicalToken(s, p, block_tokens));
      }
    }
    const int32_t n = static_cast<int32_t>(tokens.size());
    EXPECT_EQ(m.last_row[0], slots + n - 1);
    for (int32_t i = 0; i < chunk; ++i) {
      const int32_t row = slots + i;
      EXPECT_EQ(m.active[row], i < n ? 1 : 0);
      EXPECT_EQ(m.sample[row], 0);
      if (i >= n) continue;
      EXPECT_EQ(m.table[row], slots);
      EXPECT_EQ(m.token[row], tokens[i]);
      EXPECT_EQ(m.position[row], c.start + i);
      EXPECT_EQ(m.PhysicalToken(slots, c.start + i, block_tokens),
                PhysicalToken(runs, 2, block_tokens, c.start + i));
    }
    std::fill(mbuf.begin(), mbuf.end(), -7);
  }

  // Refused, with nothing left packed: the chunk's slot decoding too, a chunk longer than the
  // graph's chunk rows, a chunk table wider than the layout's.
  StepDescriptor d;
  d.Resize(slots, max_runs);
  d.active[2] = 1;
  d.token[2] = 1;
  d.position[2] = 3;
  d.num_runs[2] = 1;
  d.SlotRuns(2)[0] = KvRun{0, 1};
  std::vector<int32_t> tokens(4, 1);
  KvRun wide[6];
  for (int32_t r = 0; r < 6; ++r) wide[r] = KvRun{100 + 2 * r, 1};
  PrefillChunk c;
  c.slot = 2;
  c.tokens = tokens;
  c.runs = wide;
  c.num_runs = 1;
  EXPECT_EQ(PackMixedInputs(c, d, ml, limits, mbuf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  c.slot = 3;
  ASSERT_TRUE(PackMixedInputs(c, d, ml, limits, mbuf.data()).ok());
  c.num_runs = 6;
  std::fill(mbuf.begin(), mbuf.end(), 9);
  const absl::Status st = PackMixedInputs(c, d, ml, limits, mbuf.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("prefill chunk of slot 3.num_runs"), absl::string_view::npos)
      << st.message();
  EXPECT_EQ(std::count(mbuf.begin(), mbuf.end(), 0), ml.total);
  std::vector<int32_t> long_tokens(chunk + 1, 1);
  c.num_runs = 1;
  c.tokens = long_tokens;
  EXPECT_EQ(PackMixedInputs(c, d, ml, limits, mbuf.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// LoRA adapters: an active decode row carries 1 + its slot's adapter, each chunk row 1 + the
// chunk's, inactive rows and padding 0 (the base model); an adapter outside the backend's slots
// is refused naming the slot and field, and AnyAdapterRow tells the step which graph to replay.
TEST(StepPackingTest, AdapterRowsArePackedAsOnePlusTheSlotAndChecked) {
  std::mt19937 rng(41);
  const int32_t slots = 10, chunk = 16, max_runs = 4, block_tokens = 16, vocab = 300;
  const int64_t pool = 300;
  PackLimits limits{pool, block_tokens, 1024, vocab};
  limits.lora_adapters = 3;
  const StepInputLayout dl = DecodeLayout(slots, max_runs);
  const StepInputLayout ml = MixedLayout(slots, chunk, max_runs);
  const StepInputLayout pl = PrefillLayout(chunk, max_runs);
  std::vector<int32_t> dbuf(dl.total), mbuf(ml.total), pbuf(pl.total);
  for (int iter = 0; iter < 30; ++iter) {
    StepDescriptor d = RandomStep(rng, slots, max_runs, pool, block_tokens, vocab);
    for (int32_t s = 0; s < slots; ++s) {
      d.adapter[s] = static_cast<int32_t>(rng() % 4) - 1;  // -1 (base) .. 2
    }
    ASSERT_TRUE(PackDecodeInputs(d, dl, limits, dbuf.data()).ok());
    const StepInputs in = StepInputs::At(dl, dbuf.data());
    bool any = false;
    for (int32_t s = 0; s < slots; ++s) {
      EXPECT_EQ(in.adapter[s], d.active[s] ? d.adapter[s] + 1 : 0) << "slot " << s;
      any |= d.active[s] && d.adapter[s] >= 0;
    }
    EXPECT_EQ(AnyAdapterRow(dl, dbuf.data()), any);

    int32_t free_slot = 0;
    while (free_slot < slots && d.active[free_slot]) ++free_slot;
    if (free_slot == slots) d.active[free_slot = 0] = 0;
    const KvRun runs[] = {{250, 3}};
    std::vector<int32_t> tokens(1 + rng() % chunk, 5);
    PrefillChunk c;
    c.slot = free_slot;
    c.tokens = tokens;
    c.runs = runs;
    c.num_runs = 1;
    c.adapter = static_cast<int32_t>(rng() % 4) - 1;
    ASSERT_TRUE(PackMixedInputs(c, d, ml, limits, mbuf.data()).ok());
    ASSERT_TRUE(PackPrefillInputs(c, pl, limits, pbuf.data()).ok());
    const StepInputs m = StepInputs::At(ml, mbuf.data()), p = StepInputs::At(pl, pbuf.data());
    const int32_t n = static_cast<int32_t>(tokens.size());
    any = false;  // the chunk's slot may have just left the decode rows
    for (int32_t s = 0; s < slots; ++s) {
      EXPECT_EQ(m.adapter[s], d.active[s] ? d.adapter[s] + 1 : 0) << "slot " << s;
      any |= d.active[s] && d.adapter[s] >= 0;
    }
    for (int32_t i = 0; i < chunk; ++i) {
      EXPECT_EQ(m.adapter[slots + i], i < n ? c.adapter + 1 : 0) << "chunk row " << i;
      EXPECT_EQ(p.adapter[i], i < n ? c.adapter + 1 : 0) << "chunk row " << i;
    }
    EXPECT_EQ(AnyAdapterRow(pl, pbuf.data()), c.adapter >= 0);
    EXPECT_EQ(AnyAdapterRow(ml, mbuf.data()), any || c.adapter >= 0);
  }

  StepDescriptor d;
  d.Resize(slots, max_runs);
  d.active[4] = 1;
  d.token[4] = 1;
  d.position[4] = 3;
  d.num_runs[4] = 1;
  d.SlotRuns(4)[0] = KvRun{0, 1};
  d.adapter[4] = 3;  // past the 3 slots
  std::fill(dbuf.begin(), dbuf.end(), 9);
  absl::Status st = PackDecodeInputs(d, dl, limits, dbuf.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("slot 4.adapter = 3"), absl::string_view::npos) << st.message();
  EXPECT_EQ(std::count(dbuf.begin(), dbuf.end(), 0), dl.total);
  d.adapter[4] = -2;
  EXPECT_EQ(PackDecodeInputs(d, dl, limits, dbuf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  d.adapter[4] = 2;
  EXPECT_TRUE(PackDecodeInputs(d, dl, limits, dbuf.data()).ok());
  // A backend with no adapter slots takes only the base model.
  limits.lora_adapters = 0;
  EXPECT_EQ(PackDecodeInputs(d, dl, limits, dbuf.data()).code(),
            absl::StatusCode::kInvalidArgument);
  d.adapter[4] = -1;
  EXPECT_TRUE(PackDecodeInputs(d, dl, limits, dbuf.data()).ok());
  std::vector<int32_t> tokens(3, 1);
  const KvRun runs[] = {{8, 1}};
  PrefillChunk c;
  c.slot = 1;
  c.tokens = tokens;
  c.runs = runs;
  c.num_runs = 1;
  c.adapter = 0;
  st = PackPrefillInputs(c, pl, limits, pbuf.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("prefill chunk of slot 1.adapter = 0"), absl::string_view::npos)
      << st.message();
}

}  // namespace
}  // namespace kvrm::cuda
