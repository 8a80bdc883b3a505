#include "kernels/cpu/isa.h"

#include <atomic>

#include "common/logging.h"

namespace kvrm {
namespace {

bool Supports(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric:
      return true;
    case CpuIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case CpuIsa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    case CpuIsa::kAvx512Bf16:
      // VNNI too (vpdpwssd, the q8_0 kernel): every processor with AVX512_BF16 has it.
      return Supports(CpuIsa::kAvx512) && __builtin_cpu_supports("avx512bf16") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

std::atomic<int> g_active_isa{-1};

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kGeneric: return "generic";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512_bf16";
  }
  return "unknown";
}

std::vector<CpuIsa> AvailableCpuIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa :
       {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (Supports(isa)) out.push_back(isa);
  }
  return out;
}

CpuIsa ActiveCpuIsa() {
  int v = g_active_isa.load(std::memory_order_relaxed);
  if (v < 0) {
    v = static_cast<int>(AvailableCpuIsas().back());
    g_active_isa.store(v, std::memory_order_relaxed);
  }
  return static_cast<CpuIsa>(v);
}

void SetActiveCpuIsa(CpuIsa isa) {
  CHECK(Supports(isa)) << "instruction set " << CpuIsaName(isa) << " not supported here";
  g_active_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

bool ParseCpuIsa(std::string_view name, CpuIsa* isa) {
  for (CpuIsa candidate : AvailableCpuIsas()) {
    if (CpuIsaName(candidate) == name) {
      *isa = candidate;
      return true;
    }
  }
  return false;
}

std::string AvailableCpuIsaNames() {
  std::string out;
  for (CpuIsa isa : AvailableCpuIsas()) {
    out += (out.empty() ? "" : ", ") + std::string(CpuIsaName(isa));
  }
  return out;
}

}  // namespace kvrm
