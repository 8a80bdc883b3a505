// The instruction-set path of the CPU kernels (matmul, attention), chosen at run time: the best
// this processor runs unless overridden (tests and benchmarks run every available path).
#ifndef KVRM_KERNELS_CPU_ISA_H_
#define KVRM_KERNELS_CPU_ISA_H_

#include <string>
#include <string_view>
#include <vector>

namespace kvrm {

// kAvx512Bf16 is kAvx512 plus vdpbf16ps for bf16 weights, which rounds the activations to bf16
// (as GPU bf16 GEMMs do); the other paths keep f32 activations.
enum class CpuIsa { kGeneric, kAvx2, kAvx512, kAvx512Bf16 };

std::string_view CpuIsaName(CpuIsa isa);
// The instruction sets this processor can run, best last.
std::vector<CpuIsa> AvailableCpuIsas();
// The path the kernels use (the best available unless overridden).
CpuIsa ActiveCpuIsa();
void SetActiveCpuIsa(CpuIsa isa);  // CHECK-fails if unavailable
// The available path named `name` (CpuIsaName); false when none is.
bool ParseCpuIsa(std::string_view name, CpuIsa* isa);
// The available paths' names, comma-separated (for error messages).
std::string AvailableCpuIsaNames();

}  // namespace kvrm

#endif  // KVRM_KERNELS_CPU_ISA_H_
