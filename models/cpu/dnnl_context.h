// The CPU backend's process-wide oneDNN engine and stream, and the user scratchpad that every
// primitive shares (see dnnl_ops.cpp), for ops that live in other files of models/cpu/.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>

#include "models/tensor.h"

namespace trainer::models::cpu {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();
// Attributes that make a primitive use the shared scratchpad instead of allocating its own.
dnnl::primitive_attr dnnl_scratchpad_attr();
// The shared scratchpad, grown to hold md.
dnnl::memory dnnl_scratchpad(const dnnl::memory::desc& md);
// The memory descriptor of an {N, C, H, W} activation in `layout`.
dnnl::memory::desc activation_md(int64_t n, int64_t c, int64_t h, int64_t w, Layout layout,
                                 DType dtype = DType::kF32);

}  // namespace trainer::models::cpu
