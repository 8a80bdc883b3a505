// The instruction-set path of the CPU kernels (matmul, attention), chosen at run time: the best
// this processor runs unless overridden (tests and benchmarks run every available path).
#ifndef KVRM_KERNELS_CPU_ISA_H_
#define KVRM_KERNELS_CPU_ISA_H_

#include <string>
#include <string_view>
#include <vector>

// For plain C++ loops (no intrinsics) that GCC should vectorise for each instruction set: the
// function is compiled for x86-64-v4 (AVX-512), v3 (AVX2) and the baseline, and the loader picks
// one (ifunc). Not under ThreadSanitizer: GCC instruments the ifunc resolver too, and the loader
// runs it before the TSan runtime is up, so every binary linking such a function crashed
// (SIGSEGV) before main.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define KVRM_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KVRM_CPU_CLONES
#endif

namespace kvrm {

// kAvx512Bf16 is kAvx512 plus vdpbf16ps for bf16 weights, which rounds the activations to bf16
// (as GPU bf16 GEMMs do; the other paths keep f32 activations), and AVX512_VNNI's vpdpwssd for
// q8_0 weights.
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
