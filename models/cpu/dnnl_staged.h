// A buffer in the layout a oneDNN primitive wants, beside the user's buffer in the layout the
// model keeps (weights in PyTorch's, activations in Layout): the reorders between the two are made
// once, and nothing is copied when the layouts agree. Used by the convolutions (dnnl_ops.cpp) and
// the LSTM (lstm_dnnl.cpp).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstring>

#include "models/cpu/dnnl_context.h"
#include "models/tensor.h"

namespace trainer::models::cpu {

struct Staged {
  dnnl::memory::desc user, want;
  HostBuffer storage;
  dnnl::memory mem;
  dnnl::reorder to_want, from_want;

  void prepare(const dnnl::memory::desc& user_md, const dnnl::memory::desc& wanted) {
    user = user_md;
    want = wanted;
    if (same()) return;
    storage.resize(static_cast<int64_t>(want.get_size() / sizeof(float)) + 1);
    mem = dnnl::memory(want, dnnl_engine(), storage.data());
    dnnl::memory u(user, dnnl_engine(), nullptr);
    to_want = dnnl::reorder(u, mem);
    from_want = dnnl::reorder(mem, u);
  }
  bool same() const { return user == want; }
  // A memory in the wanted layout holding `data` (reordered into storage if needed).
  dnnl::memory in(const float* data) {
    dnnl::memory u(user, dnnl_engine(), const_cast<float*>(data));
    if (same()) return u;
    to_want.execute(dnnl_stream(), u, mem);
    return mem;
  }
  // Memory to compute into; out_done(data) then moves the result to the user's buffer.
  dnnl::memory out(float* data) { return same() ? dnnl::memory(user, dnnl_engine(), data) : mem; }
  // The same, zeroed first, for primitives that accumulate into their output.
  dnnl::memory zeroed_out(float* data) {
    std::memset(same() ? static_cast<void*>(data) : static_cast<void*>(storage.data()), 0,
                (same() ? user : want).get_size());
    return out(data);
  }
  void out_done(float* data) {
    if (same()) return;
    dnnl::memory u(user, dnnl_engine(), data);
    from_want.execute(dnnl_stream(), mem, u);
  }
};

}  // namespace trainer::models::cpu
