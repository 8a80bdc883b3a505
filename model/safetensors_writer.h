// Writes safetensors files in the reference layout, readable by huggingface/safetensors and
// Transformers' from_pretrained as well as by SafetensorsFile.
#ifndef KVRM_MODEL_SAFETENSORS_WRITER_H_
#define KVRM_MODEL_SAFETENSORS_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "model/safetensors.h"

namespace kvrm {

struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  absl::Span<const std::byte> data;  // numel * DTypeSize(dtype) bytes; not copied
  // Another element type than `dtype` (a quantized checkpoint's I32 words, I64 shapes): data is
  // then numel * StorageTypeSize(*type) bytes.
  std::optional<StorageType> type;
};

// Writes one file: 8-byte little-endian header length, the JSON header padded with spaces to a
// multiple of 8 (so the data section starts 8-aligned), then the tensors' bytes packed
// back to back in the given order. The reference reader rejects gaps between tensors, so none
// are inserted: each tensor is aligned to its element size when the ones before it keep that
// (always, for a single-dtype file or with wider dtypes first). Data is streamed from the spans
// with write(2), never copied. The file is written to `path + ".tmp"`, fsynced, then renamed
// over `path`, so readers never see a partial file.
// INVALID_ARGUMENT for duplicate/empty/reserved names, bad shapes, or a data size mismatch.
absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Rewrites the file at `path` with `extra` after its own tensors (names must be new), its
// metadata kept: WriteSafetensors over the file's own mapping, so the file is replaced whole and
// atomically. Non-float tensors (a quantized checkpoint's I32, F8_E4M3, ...) keep their type.
absl::Status AppendToSafetensors(const std::string& path, absl::Span<const TensorToWrite> extra);

// As Transformers' save_pretrained: splits `tensors` in order into `num_shards` files
// model-0000K-of-0000N.safetensors of about equal size (each non-empty) plus
// model.safetensors.index.json {"metadata": {"total_size": bytes}, "weight_map": {name: file}}.
// Every shard carries __metadata__ {"format": "pt"}, which from_pretrained expects.
// num_shards == 1 writes model.safetensors alone. `dir` must exist.
absl::Status WriteSafetensorsSharded(const std::string& dir,
                                     absl::Span<const TensorToWrite> tensors, int num_shards);

}  // namespace kvrm

#endif  // KVRM_MODEL_SAFETENSORS_WRITER_H_
