// kvrmd's --device flag: picks the backend the engine runs on.
//   cpu   the CPU backend (always available)
//   cuda  the CUDA backend (runtime/cuda); an error where this build has no CUDA or the machine
//         no GPU
//   auto  cuda when this build has CUDA and the machine shows an NVIDIA GPU, else cpu
#ifndef KVRM_SERVER_DEVICE_BACKEND_H_
#define KVRM_SERVER_DEVICE_BACKEND_H_

#include <string>

#include "absl/status/statusor.h"
#include "runtime/engine.h"

namespace kvrm {

struct DeviceChoice {
  std::string device;  // "cpu" or "cuda"
  // Null for cpu (the engine's default backend).
  decltype(EngineOptions::backend_factory) factory;
};

// INVALID_ARGUMENT for an unknown name; FAILED_PRECONDITION for cuda where it cannot run.
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& flag);

// Whether this binary was built with the CUDA backend.
bool BuiltWithCuda();

}  // namespace kvrm

#endif  // KVRM_SERVER_DEVICE_BACKEND_H_
