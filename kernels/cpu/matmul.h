// Products of activations with weight matrices: y[n][rows] = x[n][cols] * W^T, f32 accumulate.
//
// Weights stay in their stored dtype (f32, f16 or bf16), row-major or also in panels
// (WeightMatrix::panels) for the AVX-512 paths, or in q8_0 panels (kernels/cpu/q8_0.h) for every
// path, and each weight byte is read from memory once per
// call whatever n is: decode (n = active slots) is bound by weight bandwidth, as it should be.
// Vectorised per instruction set (AVX-512 with or without BF16 dot products, AVX2+FMA+F16C,
// portable), chosen at run time.
#ifndef KVRM_KERNELS_CPU_MATMUL_H_
#define KVRM_KERNELS_CPU_MATMUL_H_

#include <cstdint>
#include <memory>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm {

// Whether MatMul on `isa` rounds the activations to bf16 for weights of `dtype` (avx512_bf16 with
// bf16 weights); every other path keeps them in f32.
inline bool MatMulRoundsActivations(CpuIsa isa, DType dtype) {
  return isa == CpuIsa::kAvx512Bf16 && dtype == DType::kBF16;
}

// Scratch floats each pool thread needs for a matrix of `cols` columns.
int64_t MatMulScratchFloats(int64_t cols);

// y[i * ldy + r] = sum_c x[i * ldx + c] * W[r][c] for i < n, r < w.rows.
// `scratch` holds pool.num_threads() * MatMulScratchFloats(w.cols) floats.
void MatMul(ThreadPool& pool, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
            float* y, int64_t ldy, float* scratch);

// Thread `thread` of `num_threads`'s share of MatMul: a contiguous range of whole row tiles.
// For fusing several products (and their epilogues) into one parallel region: each thread calls
// this for every product with its own `scratch` (MatMulScratchFloats(w.cols) floats).
void MatMulShare(CpuIsa isa, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                 float* y, int64_t ldy, int thread, int num_threads, float* scratch);

// The rows [*begin, *end) of a `rows`-row matrix that MatMulShare gives thread `thread`: whole
// groups of WeightMatrix::kPanelRows rows, so every share starts a panel.
void MatMulShareBounds(int64_t rows, int thread, int num_threads, int64_t* begin, int64_t* end);

// Single-threaded kernel over rows [row_begin, row_end) (exposed for tests and TP shards). A
// matrix with q8_0 panels needs row_begin to start a panel; one with q8_0 data needs its q8_0
// panels (no path reads q8_0 rows).
void MatMulRows(CpuIsa isa, const float* x, int64_t n, int64_t ldx, const WeightMatrix& w,
                int64_t row_begin, int64_t row_end, float* y, int64_t ldy, float* scratch);

// Whether MatMul on `isa` reads the panels of a `dtype` matrix that has them: avx512 reads f32
// and f16 panels, avx512_bf16 all three; the other paths read the row-major data only.
inline bool MatMulReadsPanels(CpuIsa isa, DType dtype) {
  if (isa == CpuIsa::kAvx512Bf16) return true;
  return isa == CpuIsa::kAvx512 && dtype != DType::kBF16;
}

// The panel copy of a dense matrix of any dtype (WeightMatrix::panels): PanelBytes(w) bytes,
// written by PackPanels into `out` (64-byte aligned).
int64_t PanelBytes(const WeightMatrix& w);
void PackPanels(const WeightMatrix& w, void* out);

// The format of a matrix's block panels: the data's block format, or q8_0 for dense data (which
// is quantized; or q4_K, asked for), and their bytes in `format` (kDense: BlockPanelFormat(w)):
// per group of 16 rows, per block of the format's columns, a panel block.
WeightFormat BlockPanelFormat(const WeightMatrix& w);
int64_t BlockPanelBytes(const WeightMatrix& w, WeightFormat format = WeightFormat::kDense);

// The panels of each block format, BlockPanelBytes(w, format) bytes written into `out` (64-byte
// aligned), the rows past the last group's zero:
// - q8 (kernels/cpu/q8_0.h), in BlockPanelFormat(w): from q8 data the blocks are copied as they
//   are; dense data is quantized (QuantizeBlockQ8_0, a last partial block zero-padded);
// - q4_K (kernels/cpu/q4_k.h) of a q4_K matrix, or of a dense one quantized row by row
//   (QuantizeRowQ4K: kvrmd --quantization=q4_K); cols a multiple of 256;
// - q6_K (kernels/cpu/q4_k.h) of a q6_K matrix; cols a multiple of 256.
void PackQ8Panels(const WeightMatrix& w, void* out);
void PackQ4KPanels(const WeightMatrix& w, void* out);
void PackQ6KPanels(const WeightMatrix& w, void* out);

// A matrix's panel copy in memory it owns (64-byte aligned), in `format`: PackPanels' for kDense,
// PackQ8Panels', PackQ4KPanels' or PackQ6KPanels' for a block format (BlockPanelFormat(w), or
// q4_K for dense data). Movable, the data stays put.
class PanelCopy {
 public:
  explicit PanelCopy(const WeightMatrix& w, WeightFormat format = WeightFormat::kDense);
  const void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }

 private:
  std::unique_ptr<uint8_t[]> memory_;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_MATMUL_H_
