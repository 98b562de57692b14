// What oneDNN dispatches to on this CPU (architecture.md section 2, "The engine is ISA-portable").
//
// oneDNN picks its kernels at run time for the CPU it finds (capped by ONEDNN_MAX_CPU_ISA). Its JIT
// kernels want activations in a channel-blocked layout whose block is the vector width: nChw16c on
// AVX-512, nChw8c on AVX2. A primitive made with any other layout silently gets the reference
// implementation (100-1000x slower). So the layout is asked of oneDNN, never assumed, and every
// primitive the backend makes is recorded with the implementation it got: a reference one prints a
// warning at once, and tests/dispatch_test.cpp fails on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/backend_settings.h"
#include "models/tensor.h"

namespace trainer::models::cpu {

// The ISA oneDNN dispatches for ("avx512_core_bf16", "avx2", ...; ONEDNN_MAX_CPU_ISA applies).
const char* dnnl_isa_name();

// The blocked layout oneDNN's convolutions in `precision` choose on this CPU (asked once, with
// format `any`, on a typical 3x3 convolution); kChannelsLast when they choose no blocking.
Layout dnnl_blocked_layout(Precision precision);
// The layout an activation of `channels` channels is kept in: the blocked one where the channels
// fill whole blocks, else channels-last.
Layout dnnl_activation_layout(int64_t channels, Precision precision);

// One primitive the backend made: what it is ("conv fwd", "bnorm bwd", ...), its source shape and
// layout, and oneDNN's implementation name ("brg:avx512_core", "jit:avx2", "ref:any", ...).
struct PrimitiveRecord {
  std::string kind, shape, impl;
};
// Records a primitive. A reference implementation prints one warning line (once per kind and
// shape) naming it, the ISA and the cost; TRAINER_DNNL_VERBOSE=1 prints every distinct primitive.
void record_primitive(const std::string& kind, const std::string& shape, const std::string& impl);
// Every primitive recorded so far, in the order they were made.
std::vector<PrimitiveRecord> recorded_primitives();
// oneDNN's reference implementations: "ref:any", "bnorm_ref:any" and the like.
bool is_reference_impl(const std::string& impl);
// Why a reference implementation is fine for this primitive (the allowlist), or null when it is not.
const char* reference_allowed(const PrimitiveRecord& record);

}  // namespace trainer::models::cpu
