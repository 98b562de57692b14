// The Listen-Attend-Spell model's private working state, shared by its training code (las.cpp) and
// its decoding (las_decode.cpp). Every tensor lives on the model's backend; the host keeps only
// the per-utterance ints it computes (lengths, the targets' layout, the beam's bookkeeping) and
// their staging copies.
#pragma once

#include <vector>

#include "models/device_buffer.h"
#include "models/nets/las.h"

namespace trainer::models {

// Token ids and row indices ride in float device buffers (DeviceBuffer is float storage), as the
// image labels do (trainer/step/device_batch.h).
static_assert(sizeof(int32_t) == sizeof(float), "int32 arrays ride in float device buffers");
inline int32_t* device_ints(DeviceBuffer& b) { return reinterpret_cast<int32_t*>(b.data()); }

// Pointers to one speller step: inputs (tokens, previous context and states) and where the step
// writes (states, the records backward reads, logits). Training points them into the per-step
// records; decoding into ping-pong buffers. All device pointers.
struct Las::Step {
  const int32_t* tokens = nullptr;
  const float* context_prev = nullptr;  // rows x C with stride context_stride; null = zeros
  int64_t context_stride = 0;
  std::vector<const float*> h_prev, c_prev;  // per cell, rows x Hs
  std::vector<float*> h, c, gates, tanh_c;   // per cell
  float* input = nullptr;    // rows x (E + C): [embedding ; previous context]
  float* query = nullptr;    // rows x A, after the ReLU
  float* alpha = nullptr;    // rows x T' attention weights (zero past each utterance's length)
  float* state_context = nullptr;  // rows x (Hs + C): [s_t ; c_t], the output layer's input
  float* logits = nullptr;   // rows x classes
};

struct Las::Workspace {
  explicit Workspace(Backend& backend) : backend(backend) {}
  Backend& backend;  // where every tensor below lives
  // Listener.
  OwnedTensor time_major{backend};       // {T, N, F}
  std::vector<OwnedTensor> pyramid;      // input of pblstm k: {T_k, N, 4 Hl}
  std::vector<OwnedTensor> pyramid_grad; // gradient of each BLSTM's output
  OwnedTensor values{backend}, keys{backend};  // {N, T', C}, {N, T', A} (keys after the ReLU)
  // The speller's gradients of values and keys; time-major.
  OwnedTensor dvalues{backend}, dkeys{backend}, dlistener{backend};
  // Speller records of the last forward, step-major {U, N, ...}; states have U + 1 rows of steps,
  // step 0 being the zero initial state.
  int64_t steps = 0;
  std::vector<OwnedTensor> h, c, gates, tanh_c, dgates;
  OwnedTensor input{backend}, query{backend}, alpha{backend}, state_context{backend}, logits{backend};
  OwnedTensor bias_sum{backend};  // {cells, 4 Hs}: b_ih + b_hh
  // A forward's ints, uploaded once into `ints` from the host copy `host_ints` (kept until the
  // forward's loss has waited for the device): the tokens fed at each step {U, N} (the truth on
  // upload; teacher forcing's sampled steps overwrite theirs on the device), the draws {U, N} (1:
  // feed the model's own argmax), then the loss's target rows (step * N + n) and their targets.
  std::vector<int32_t> host_ints;
  DeviceBuffer ints{backend};
  // In `ints`: [0, UN) tokens, [UN, 2 UN) draws, [2 UN, 2 UN + M) target rows, then M targets.
  int64_t targets = 0;  // M
  OwnedTensor packed_logits{backend}, packed_grad{backend};
  // Backward scratch.
  OwnedTensor dlogits{backend}, dstate_context{backend}, dquery{backend}, denergy{backend}, dcontext{backend};
  OwnedTensor dstate{backend}, dh{backend}, dc{backend}, dinput{backend}, dcarry{backend};
  // Decoding.
  std::vector<OwnedTensor> dec_h[2], dec_c[2];
  OwnedTensor dec_sc[2] = {OwnedTensor(backend), OwnedTensor(backend)};
  OwnedTensor dec_gates{backend}, dec_tanh{backend}, dec_input{backend}, dec_query{backend}, dec_alpha{backend};
  OwnedTensor dec_logits{backend};
  // Each step's tokens and survivors' parent rows {2, R}, staged on the host and uploaded; and the
  // step's logits copied to the host, where the beam is scored.
  std::vector<int32_t> dec_host_ints;
  DeviceBuffer dec_ints{backend};
  std::vector<float> dec_host_logits;
};

}  // namespace trainer::models
