#include "models/cpu/dnnl_precision.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <stdexcept>
#include <string>

#include "models/cpu/dnnl_dispatch.h"

namespace trainer::models::cpu {

bool dnnl_has_bf16() {
  // From avx512_core up (the ISAs include each other in this order). avx2_vnni_2 (AVX2 with bf16
  // conversions) is left out: oneDNN 3.2 has bf16 kernels there for a few primitives only.
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx512_core:
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_fp16:
    case dnnl::cpu_isa::avx512_core_amx:
    case dnnl::cpu_isa::avx512_core_amx_fp16:
      return true;
    default:
      return false;
  }
}

void require_precision(Precision precision) {
  if (precision == Precision::kTf32)
    throw std::invalid_argument("runtime.precision = \"tf32\": TF32 is a GPU tensor-core mode that CPUs do not have; "
                                "use fp32 or bf16 on runtime.device = \"cpu\"");
  if (precision == Precision::kBf16 && !dnnl_has_bf16())
    throw std::invalid_argument(std::string("runtime.precision = \"bf16\": oneDNN has no bf16 kernels at ISA ") +
                                dnnl_isa_name() +
                                " (it needs AVX-512: avx512_core emulates bf16, avx512_bf16 and AMX run it natively); "
                                "use runtime.precision = \"fp32\" on this CPU");
}

}  // namespace trainer::models::cpu
