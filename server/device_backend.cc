#include "server/device_backend.h"

#include <filesystem>

#if defined(KVRM_WITH_CUDA)
#include "runtime/cuda/cuda_backend.h"
#endif

namespace kvrm {
namespace {

// An NVIDIA GPU is visible (checked without touching the CUDA runtime, so a CPU-only machine
// never loads the driver libraries).
bool NvidiaGpuVisible() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidia0", ec) ||
         std::filesystem::exists("/proc/driver/nvidia/gpus", ec);
}

}  // namespace

bool BuiltWithCuda() {
#if defined(KVRM_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& flag) {
  if (flag != "cpu" && flag != "cuda" && flag != "auto") {
    return absl::InvalidArgumentError("--device=" + flag + ": use cpu, cuda or auto");
  }
  DeviceChoice choice;
  choice.device = "cpu";
  if (flag == "cpu") return choice;
  const bool gpu = BuiltWithCuda() && NvidiaGpuVisible();
  if (!gpu) {
    if (flag == "auto") return choice;
    return absl::FailedPreconditionError(
        BuiltWithCuda() ? "--device=cuda: no NVIDIA GPU is visible on this machine"
                        : "--device=cuda: this kvrmd was built without the CUDA toolkit");
  }
#if defined(KVRM_WITH_CUDA)
  if (cuda::CudaDeviceCount() == 0) {
    if (flag == "auto") return choice;
    return absl::FailedPreconditionError("--device=cuda: the CUDA runtime sees no device");
  }
  choice.device = "cuda";
  choice.factory = [](const ModelBundle& model,
                      const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<Backend>> {
    if (o.quantization != WeightFormat::kDense) {
      return absl::InvalidArgumentError(
          "--quantization=q8_0 and q4_K run on the CPU backend only (--device=cpu); on the GPU "
          "the weights are bf16");
    }
    cuda::CudaBackendOptions co;
    co.kv_blocks = o.kv_blocks;
    co.kv_block_tokens = o.block_tokens;
    co.kv_dtype = o.kv_dtype;  // f32 or bf16 (the device pool and the pinned host tier)
    co.max_slots = o.slots;
    co.max_chunk_tokens = o.prefill_chunk;
    co.max_context = o.max_context;
    co.max_runs = o.max_runs;
    co.tensor_parallel = o.tensor_parallel;
    co.mixed_graph = o.fuse_prefill;        // no third graph when chunks run apart anyway
    co.device_sampling = o.device_sampling;  // nor sampling scratch when the host samples
    co.max_lora_adapters = o.max_loras;      // the --lora_modules first, then runtime loads
    co.max_lora_rank = o.max_loras > 0 ? o.max_lora_rank : 0;
    for (const LoraAdapter& a : model.lora_adapters) co.lora_adapters.push_back(&a);
    // The pinned host tier must fit the container's memory (the pool is on the GPUs).
    if (absl::Status st = CheckKvFitsMemory(model.config, o, /*pool_in_host_memory=*/false,
                                            ReadMemoryLimit());
        !st.ok()) {
      return st;
    }
    absl::StatusOr<std::unique_ptr<cuda::CudaBackend>> b =
        cuda::CudaBackend::Create(model.config, &model.weights, co);
    if (!b.ok()) return b.status();
    return std::unique_ptr<Backend>(std::move(*b));
  };
#endif
  return choice;
}

}  // namespace kvrm
