#include "models/nets/las.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "models/nets/las_workspace.h"

namespace trainer::models {
namespace {

void uniform_init(Tensor t, float bound, Rng& rng) {
  std::uniform_real_distribution<float> uniform(-bound, bound);
  for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = uniform(rng);
}

}  // namespace

Las::Las(Backend& backend, const LasOptions& options, uint64_t seed)
    : backend_(backend), opt_(options), ws_(std::make_unique<Workspace>(backend)) {
  if (opt_.feature_dim < 1 || opt_.listener_hidden < 1 || opt_.pyramid_layers < 0 || opt_.attention_dim < 1 ||
      opt_.embedding_dim < 1 || opt_.speller_hidden < 1 || opt_.speller_layers < 1 || opt_.classes <= kLasEos ||
      opt_.beam_width < 1 || opt_.max_decode_steps < 1)
    throw std::invalid_argument("las: sizes must be positive and classes above " + std::to_string(kLasEos));
  LayerContext ctx{backend_, params_, buffers_};
  const int64_t Hl = opt_.listener_hidden, C = 2 * Hl, Hs = opt_.speller_hidden;
  blstm_ = std::make_unique<Lstm>(ctx, "listener.blstm", LstmOptions{opt_.feature_dim, Hl, 1, true});
  for (int64_t k = 0; k < opt_.pyramid_layers; ++k)
    pblstm_.push_back(
        std::make_unique<Lstm>(ctx, "listener.pblstm." + std::to_string(k), LstmOptions{2 * C, Hl, 1, true}));
  auto affine = [&](const std::string& name, int64_t in, int64_t out) {
    return Affine{params_.declare(name + ".weight", {out, in}), params_.declare(name + ".bias", {out}), in, out};
  };
  query_ = affine("attention.query", Hs, opt_.attention_dim);
  key_ = affine("attention.key", C, opt_.attention_dim);
  embedding_ = params_.declare("speller.embedding.weight", {opt_.classes, opt_.embedding_dim});
  for (int64_t j = 0; j < opt_.speller_layers; ++j) {
    const std::string name = "speller.cells." + std::to_string(j);
    Cell cell;
    cell.input = j == 0 ? opt_.embedding_dim + C : Hs;
    cell.w_ih = params_.declare(name + ".weight_ih", {4 * Hs, cell.input});
    cell.w_hh = params_.declare(name + ".weight_hh", {4 * Hs, Hs});
    cell.b_ih = params_.declare(name + ".bias_ih", {4 * Hs});
    cell.b_hh = params_.declare(name + ".bias_hh", {4 * Hs});
    cells_.push_back(cell);
  }
  output_ = affine("speller.output", Hs + C, opt_.classes);
  params_.allocate(backend_);
  buffers_.allocate(backend_);
  init(seed);
  params_.upload_initial_values();
  buffers_.upload_initial_values();
}

Las::~Las() = default;

void Las::init(uint64_t seed) {
  // PyTorch's defaults, in module order from one generator.
  Rng rng(seed);
  blstm_->init(rng);
  for (auto& layer : pblstm_) layer->init(rng);
  for (const Affine* a : {&query_, &key_}) {
    const float bound = 1.f / std::sqrt(static_cast<float>(a->in));
    uniform_init(params_.initial_value(a->weight), bound, rng);
    uniform_init(params_.initial_value(a->bias), bound, rng);
  }
  std::normal_distribution<float> normal(0.f, 1.f);
  Tensor embedding = params_.initial_value(embedding_);
  for (int64_t i = 0; i < embedding.numel(); ++i) embedding.data[i] = normal(rng);
  const float cell_bound = 1.f / std::sqrt(static_cast<float>(opt_.speller_hidden));
  for (const Cell& cell : cells_)
    for (int id : {cell.w_ih, cell.w_hh, cell.b_ih, cell.b_hh}) uniform_init(params_.initial_value(id), cell_bound, rng);
  const float out_bound = 1.f / std::sqrt(static_cast<float>(output_.in));
  uniform_init(params_.initial_value(output_.weight), out_bound, rng);
  uniform_init(params_.initial_value(output_.bias), out_bound, rng);
}

// ---- Listener ------------------------------------------------------------------------------

void Las::listen(const SpeechInput& in, Mode mode) {
  if (in.batch < 1 || in.max_frames < 1 || in.feature_dim != opt_.feature_dim)
    throw std::invalid_argument("las: expected a batch of {N, T, " + std::to_string(opt_.feature_dim) +
                                "} features, got {" + std::to_string(in.batch) + ", " + std::to_string(in.max_frames) +
                                ", " + std::to_string(in.feature_dim) + "}");
  const int64_t N = in.batch, T = in.max_frames, F = in.feature_dim, P = opt_.pyramid_layers;
  const int64_t C = 2 * opt_.listener_hidden;
  Workspace& w = *ws_;
  // The speller's per-step products read the weights through layer_gemm_weight, which may keep
  // copies of them: from here on they are those of this pass.
  backend_.weights_changed();
  lengths_.assign(P + 1, std::vector<int32_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int32_t frames = in.frames[n];
    if (frames < 1 || frames > T || (frames >> P) < 1)
      throw std::invalid_argument("las: utterance " + std::to_string(n) + " has " + std::to_string(frames) +
                                  " frames; the listener needs between " + std::to_string(int64_t{1} << P) +
                                  " and " + std::to_string(T));
    for (int64_t k = 0; k <= P; ++k) lengths_[k][n] = frames >> k;
  }
  // {N, T, F} -> time-major {T, N, F} (the features are on the backend already: SpeechInput).
  Tensor& x = w.time_major.resize({T, N, F});
  backend_.swap_axes(1, N, T, F, in.features, x.data);
  blstm_->set_lengths(lengths_[0]);
  const Tensor* h = &blstm_->forward(x, mode);
  flops_ = blstm_->forward_flops();
  resize_owned(w.pyramid, P, w.backend);
  for (int64_t k = 0; k < P; ++k) {
    // Neighbouring frames side by side: row (t, n) = [h(2t, n) ; h(2t + 1, n)], i.e. the first
    // 2 * steps frames {steps, 2, N, C} as {steps, N, 2, C}.
    const int64_t steps = h->dim(0) / 2;
    Tensor& pairs = w.pyramid[k].resize({steps, N, 2 * C});
    backend_.swap_axes(steps, 2, N, C, h->data, pairs.data);
    pblstm_[k]->set_lengths(lengths_[k + 1]);
    h = &pblstm_[k]->forward(pairs, mode);
    flops_ += pblstm_[k]->forward_flops();
  }
  // Attention reads each utterance's frames contiguously: values {N, T', C}, keys {N, T', A}.
  const int64_t Tl = h->dim(0), A = opt_.attention_dim;
  Tensor& values = w.values.resize({N, Tl, C});
  backend_.swap_axes(1, Tl, N, C, h->data, values.data);
  Tensor& keys = w.keys.resize({N, Tl, A});
  backend_.broadcast_rows(N * Tl, A, params_.value(key_.bias).data, keys.data);
  backend_.layer_gemm(false, true, N * Tl, A, C, 1.f, values.data, C, params_.value(key_.weight).data, C, 1.f,
                      keys.data, A);
  backend_.relu_forward(keys.numel(), keys.data, keys.data);
  flops_ += 2.0 * N * Tl * C * A;
  // Each cell's two bias vectors, summed once for all its steps.
  const int64_t Hs = opt_.speller_hidden;
  float* bias_sum = w.bias_sum.resize({int64_t(cells_.size()), 4 * Hs}).data;
  for (size_t j = 0; j < cells_.size(); ++j)
    backend_.add(4 * Hs, params_.value(cells_[j].b_ih).data, params_.value(cells_[j].b_hh).data,
                 bias_sum + j * 4 * Hs);
}

void Las::listener_backward() {
  Workspace& w = *ws_;
  const int64_t N = w.values.view().dim(0), Tl = w.values.view().dim(1), C = 2 * opt_.listener_hidden,
                A = opt_.attention_dim;
  // Through the keys' ReLU and Linear, adding into the values' gradient.
  Tensor dkeys = w.dkeys.view();
  Tensor dvalues = w.dvalues.view();
  backend_.relu_backward(dkeys.numel(), w.keys.view().data, dkeys.data, dkeys.data);
  backend_.layer_gemm(true, false, A, C, N * Tl, 1.f, dkeys.data, A, w.values.view().data, C, 0.f,
                      params_.grad(key_.weight).data, C);
  backend_.sum_rows(N * Tl, A, dkeys.data, params_.grad(key_.bias).data);
  gradients_final_from("attention.query");  // the key and the query (its gradient came first)
  backend_.layer_gemm(false, false, N * Tl, C, A, 1.f, dkeys.data, A, params_.value(key_.weight).data, C, 1.f,
                      dvalues.data, C);
  // Back to time-major, then down the pyramid.
  Tensor& d = w.dlistener.resize({Tl, N, C});
  backend_.swap_axes(1, N, Tl, C, dvalues.data, d.data);
  const Tensor* grad = &d;
  const int64_t P = opt_.pyramid_layers;
  resize_owned(w.pyramid_grad, P, w.backend);
  for (int64_t k = P - 1; k >= 0; --k) {
    const Tensor& dpairs = pblstm_[k]->backward(*grad);
    gradients_final_from("listener.pblstm." + std::to_string(k));
    // The previous BLSTM's output had T_k frames; an odd last one was dropped (zero gradient).
    const int64_t steps = dpairs.dim(0);
    const int64_t below = k == 0 ? w.time_major.view().dim(0) : w.pyramid[k - 1].view().dim(0);
    Tensor& dh = w.pyramid_grad[k].resize({below, N, C});
    backend_.swap_axes(steps, N, 2, C, dpairs.data, dh.data);
    backend_.fill((below - 2 * steps) * N * C, 0.f, dh.data + 2 * steps * N * C);
    grad = &dh;
  }
  blstm_->backward(*grad);  // the features' gradient is not needed
  gradients_final_from("listener.blstm");
}

// ---- Speller -------------------------------------------------------------------------------

void Las::speller_step(const Step& s, int64_t rows, const int32_t* row_utterance) {
  const int64_t E = opt_.embedding_dim, C = 2 * opt_.listener_hidden, Hs = opt_.speller_hidden,
                A = opt_.attention_dim, V = opt_.classes, in0 = E + C;
  Workspace& w = *ws_;
  // The input rows [embedding(token) ; previous context] (zeros at the first step).
  if (s.context_prev)
    backend_.copy_2d(rows, C, s.context_prev, s.context_stride, s.input + E, in0);
  else
    backend_.fill(rows * in0, 0.f, s.input);
  backend_.embedding_forward(rows, E, s.tokens, params_.value(embedding_).data, s.input, in0);
  const float* x = s.input;
  for (size_t j = 0; j < cells_.size(); ++j) {
    const Cell& cell = cells_[j];
    backend_.broadcast_rows(rows, 4 * Hs, w.bias_sum.view().data + j * 4 * Hs, s.gates[j]);
    backend_.layer_gemm_weight(false, true, rows, 4 * Hs, cell.input, 1.f, x, cell.input,
                               params_.value(cell.w_ih).data, cell.input, 1.f, s.gates[j], 4 * Hs);
    backend_.layer_gemm_weight(false, true, rows, 4 * Hs, Hs, 1.f, s.h_prev[j], Hs, params_.value(cell.w_hh).data, Hs,
                               1.f, s.gates[j], 4 * Hs);
    backend_.lstm_cell_forward(rows, Hs, s.gates[j], s.c_prev[j], s.c[j], s.h[j], s.tanh_c[j]);
    x = s.h[j];
    flops_ += 2.0 * rows * 4 * Hs * (cell.input + Hs);
  }
  // Attention on the top cell's state s_t.
  const int64_t SC = Hs + C, Tl = ws_->values.view().dim(1);
  backend_.copy_2d(rows, Hs, x, Hs, s.state_context, SC);
  backend_.broadcast_rows(rows, A, params_.value(query_.bias).data, s.query);
  backend_.layer_gemm_weight(false, true, rows, A, Hs, 1.f, x, Hs, params_.value(query_.weight).data, Hs, 1.f, s.query,
                             A);
  backend_.relu_forward(rows * A, s.query, s.query);
  const std::vector<int32_t>& lengths = lengths_.back();
  backend_.attention_forward(rows, Tl, A, C, lengths.data(), row_utterance, s.query, w.keys.view().data,
                             w.values.view().data, s.alpha, s.state_context + Hs, SC);
  for (int64_t r = 0; r < rows; ++r) flops_ += 2.0 * lengths[row_utterance ? row_utterance[r] : r] * (A + C);
  backend_.broadcast_rows(rows, V, params_.value(output_.bias).data, s.logits);
  backend_.layer_gemm_weight(false, true, rows, V, SC, 1.f, s.state_context, SC, params_.value(output_.weight).data,
                             SC, 1.f, s.logits, V);
  flops_ += 2.0 * rows * (Hs * A + SC * V);
}

std::vector<StreamedWeights> Las::streamed_weights() const {
  std::vector<StreamedWeights> all = blstm_->streamed_weights();
  for (const auto& p : pblstm_)
    for (const StreamedWeights& w : p->streamed_weights()) all.push_back(w);
  const int64_t Hs = opt_.speller_hidden, A = opt_.attention_dim, SC = Hs + 2 * opt_.listener_hidden;
  int64_t cells = 0;
  for (const Cell& cell : cells_) cells += 4 * Hs * (cell.input + Hs);
  const int64_t output = opt_.classes * SC, N = lengths_.empty() ? 0 : int64_t(lengths_[0].size());
  all.push_back({cells + A * Hs + output, double(ws_->steps) * (2 * (cells + A * Hs) + output), N});
  return all;
}

Tensor Las::logits() const {
  return Tensor{ws_->logits.view().data, {ws_->steps, lengths_.empty() ? 0 : int64_t(lengths_[0].size()), opt_.classes}};
}

double Las::forward(const SpeechInput& in, Mode mode) {
  listen(in, mode);
  Workspace& w = *ws_;
  const int64_t N = in.batch, E = opt_.embedding_dim, C = 2 * opt_.listener_hidden, Hs = opt_.speller_hidden,
                A = opt_.attention_dim, V = opt_.classes, SC = Hs + C, Tl = w.values.view().dim(1);
  // Targets: the transcript then <eos>; U = the longest + 1 steps.
  std::vector<int64_t> offsets(N + 1, 0);
  int64_t U = 0;
  for (int64_t n = 0; n < N; ++n) {
    offsets[n + 1] = offsets[n] + in.label_lengths[n];
    U = std::max<int64_t>(U, in.label_lengths[n] + 1);
  }
  auto target = [&](int64_t t, int64_t n) -> int32_t {
    if (t < in.label_lengths[n]) return in.labels[offsets[n] + t];
    return t == in.label_lengths[n] ? kLasEos : -1;
  };
  w.steps = U;
  const size_t L = cells_.size();
  for (auto* v : {&w.h, &w.c, &w.gates, &w.tanh_c}) resize_owned(*v, L, w.backend);
  for (size_t j = 0; j < L; ++j) {
    w.h[j].resize({U + 1, N, Hs});
    w.c[j].resize({U + 1, N, Hs});
    backend_.fill(N * Hs, 0.f, w.h[j].view().data);
    backend_.fill(N * Hs, 0.f, w.c[j].view().data);
    w.gates[j].resize({U, N, 4 * Hs});
    w.tanh_c[j].resize({U, N, Hs});
  }
  float* input = w.input.resize({U, N, E + C}).data;
  float* query = w.query.resize({U, N, A}).data;
  float* alpha = w.alpha.resize({U, N, Tl}).data;
  float* state_context = w.state_context.resize({U, N, SC}).data;
  float* logits = w.logits.resize({U, N, V}).data;

  // Every step's ints at once (las_workspace.h): the true input tokens (<sos>, then the previous
  // target; past an utterance's end <eos>, where there is no loss), the teacher-forcing draws in a
  // fixed order (step, utterance) from the batch's seed, and the loss's target rows (step * N + n)
  // and targets.
  const int64_t UN = U * N;
  std::vector<int32_t>& ints = w.host_ints;
  ints.assign(2 * UN, 0);
  std::fill_n(ints.begin(), N, kLasSos);
  const bool sample = mode == Mode::kTrain && opt_.teacher_forcing < 1.0;
  // (53 random bits by hand: std::uniform_real_distribution differs between standard libraries.)
  std::mt19937_64 rng(in.seed);
  auto coin = [&rng] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  for (int64_t t = 1; t < U; ++t)
    for (int64_t n = 0; n < N; ++n) {
      const int32_t previous = target(t - 1, n);
      ints[t * N + n] = previous >= 0 ? previous : kLasEos;
      ints[UN + t * N + n] = sample && coin() >= opt_.teacher_forcing;
    }
  std::vector<int32_t> targets;
  for (int64_t t = 0; t < U; ++t)
    for (int64_t n = 0; n < N; ++n)
      if (const int32_t y = target(t, n); y >= 0) {
        if (y >= V) throw std::invalid_argument("las: label " + std::to_string(y) + " outside the vocabulary");
        ints.push_back(static_cast<int32_t>(t * N + n));
        targets.push_back(y);
      }
  ints.insert(ints.end(), targets.begin(), targets.end());
  const int64_t M = w.targets = static_cast<int64_t>(targets.size());
  w.ints.reserve(static_cast<int64_t>(ints.size()));
  int32_t* tokens = device_ints(w.ints);
  backend_.copy_to_device(tokens, ints.data(), sizeof(int32_t) * ints.size());

  Step s;
  s.h_prev.resize(L), s.c_prev.resize(L), s.h.resize(L), s.c.resize(L), s.gates.resize(L), s.tanh_c.resize(L);
  for (int64_t t = 0; t < U; ++t) {
    // Sampled steps feed the previous step's argmax where the draw says so (in place of the truth).
    if (sample && t > 0)
      backend_.select_tokens(N, V, logits + (t - 1) * N * V, tokens + UN + t * N, tokens + t * N, tokens + t * N);
    s.tokens = tokens + t * N;
    s.context_prev = t > 0 ? state_context + (t - 1) * N * SC + Hs : nullptr;
    s.context_stride = SC;
    for (size_t j = 0; j < L; ++j) {
      s.h_prev[j] = w.h[j].view().data + t * N * Hs;
      s.c_prev[j] = w.c[j].view().data + t * N * Hs;
      s.h[j] = w.h[j].view().data + (t + 1) * N * Hs;
      s.c[j] = w.c[j].view().data + (t + 1) * N * Hs;
      s.gates[j] = w.gates[j].view().data + t * N * 4 * Hs;
      s.tanh_c[j] = w.tanh_c[j].view().data + t * N * Hs;
    }
    s.input = input + t * N * (E + C);
    s.query = query + t * N * A;
    s.alpha = alpha + t * N * Tl;
    s.state_context = state_context + t * N * SC;
    s.logits = logits + t * N * V;
    speller_step(s, N, nullptr);
  }

  // The loss over the target rows, packed. It waits for the device, so `ints` may change after it.
  const int32_t* target_rows = tokens + 2 * UN;
  float* packed = w.packed_logits.resize({M, V}).data;
  backend_.gather_rows(M, V, target_rows, logits, packed);
  int64_t correct = 0;
  return backend_.softmax_cross_entropy(M, V, packed, target_rows + M, static_cast<float>(opt_.label_smoothing),
                                        w.packed_grad.resize({M, V}).data, &correct);
}

void Las::backward() {
  Workspace& w = *ws_;
  const int64_t U = w.steps, N = static_cast<int64_t>(lengths_[0].size()), E = opt_.embedding_dim,
                C = 2 * opt_.listener_hidden, Hs = opt_.speller_hidden, A = opt_.attention_dim, V = opt_.classes,
                SC = Hs + C, Tl = w.values.view().dim(1), UN = U * N;
  const size_t L = cells_.size();

  // Output layer, all steps at once.
  const int32_t* tokens = device_ints(w.ints);  // las_workspace.h: tokens, draws, target rows
  float* dlogits = w.dlogits.resize({U, N, V}).data;
  backend_.fill(UN * V, 0.f, dlogits);
  backend_.scatter_rows(w.targets, V, tokens + 2 * UN, w.packed_grad.view().data, dlogits);
  const float* state_context = w.state_context.view().data;
  float* dsc = w.dstate_context.resize({U, N, SC}).data;
  backend_.layer_gemm(false, false, UN, SC, V, 1.f, dlogits, V, params_.value(output_.weight).data, SC, 0.f, dsc, SC);
  backend_.layer_gemm(true, false, V, SC, UN, 1.f, dlogits, V, state_context, SC, 0.f,
                      params_.grad(output_.weight).data, SC);
  backend_.sum_rows(UN, V, dlogits, params_.grad(output_.bias).data);
  // Overlap: the output layer (declared last) is final; its bucket can go out during the steps
  // back through time.
  gradients_final_from("speller.output");

  // Back through time. Carried between steps: each cell's dh and dc, and the gradient of the
  // context the next step took as input.
  const float* query = w.query.view().data;
  const float* alpha = w.alpha.view().data;
  const float* keys = w.keys.view().data;
  const float* values = w.values.view().data;
  float* dquery = w.dquery.resize({U, N, A}).data;
  float* denergy = w.denergy.resize({U, N, Tl}).data;
  float* dcontext = w.dcontext.resize({U, N, C}).data;
  float* dstate = w.dstate.resize({N, Hs}).data;
  float* dh = w.dh.resize({int64_t(L), N, Hs}).data;
  float* dc = w.dc.resize({int64_t(L), N, Hs}).data;
  float* dinput = w.dinput.resize({N, E + C}).data;
  float* dcarry = w.dcarry.resize({N, C}).data;
  backend_.fill(int64_t(L) * N * Hs, 0.f, dh);
  backend_.fill(int64_t(L) * N * Hs, 0.f, dc);
  backend_.fill(N * C, 0.f, dcarry);
  resize_owned(w.dgates, L, w.backend);
  for (size_t j = 0; j < L; ++j) w.dgates[j].resize({U, N, 4 * Hs});
  Tensor dembedding = params_.grad(embedding_);
  backend_.fill(dembedding.numel(), 0.f, dembedding.data);
  const std::vector<int32_t>& lengths = lengths_.back();

  for (int64_t t = U - 1; t >= 0; --t) {
    // The context c_t: the output layer's and the next step's input's gradients.
    float* dctx = dcontext + t * N * C;
    backend_.copy_2d(N, C, dsc + t * N * SC + Hs, SC, dctx, C);
    backend_.add(N * C, dctx, dcarry, dctx);
    // Attention: alpha = softmax(K q), c = V^T alpha; then the query's ReLU.
    float* dq = dquery + t * N * A;
    backend_.attention_backward(N, Tl, A, C, lengths.data(), nullptr, keys, values, alpha + t * N * Tl, dctx,
                                denergy + t * N * Tl, dq);
    backend_.relu_backward(N * A, query + t * N * A, dq, dq);
    // s_t: the output layer's gradient plus the query's.
    backend_.copy_2d(N, Hs, dsc + t * N * SC, SC, dstate, Hs);
    backend_.layer_gemm_weight(false, false, N, Hs, A, 1.f, dq, A, params_.value(query_.weight).data, Hs, 1.f, dstate,
                               Hs);
    // The cells, top down: the gradient from above plus the one carried from step t + 1.
    const float* from_above = dstate;
    for (size_t jj = L; jj-- > 0;) {
      const Cell& cell = cells_[jj];
      float* dh_j = dh + jj * N * Hs;
      backend_.add(N * Hs, dh_j, from_above, dh_j);
      float* dg = w.dgates[jj].view().data + t * N * 4 * Hs;
      backend_.lstm_cell_backward(N, Hs, w.gates[jj].view().data + t * N * 4 * Hs, w.c[jj].view().data + t * N * Hs,
                                  w.tanh_c[jj].view().data + t * N * Hs, dh_j, dc + jj * N * Hs, dg);
      // dh for step t - 1 (this cell's recurrence), and the gradient of this cell's input.
      backend_.layer_gemm_weight(false, false, N, Hs, 4 * Hs, 1.f, dg, 4 * Hs, params_.value(cell.w_hh).data, Hs,
                                 0.f, dh_j, Hs);
      float* dx = jj > 0 ? dstate : dinput;  // dstate is free once the top cell has read it
      backend_.layer_gemm_weight(false, false, N, cell.input, 4 * Hs, 1.f, dg, 4 * Hs,
                                 params_.value(cell.w_ih).data, cell.input, 0.f, dx, cell.input);
      from_above = dx;
    }
    // The input [embedding ; previous context]: the embedding's rows, and the context's gradient
    // carried to step t - 1.
    backend_.embedding_backward(N, E, tokens + t * N, dinput, E + C, dembedding.data);
    backend_.copy_2d(N, C, dinput + E, E + C, dcarry, C);
  }

  // Weight gradients, all steps at once.
  backend_.layer_gemm(true, false, A, Hs, UN, 1.f, dquery, A, state_context, SC, 0.f,
                      params_.grad(query_.weight).data, Hs);
  backend_.sum_rows(UN, A, dquery, params_.grad(query_.bias).data);
  for (size_t j = 0; j < L; ++j) {
    const Cell& cell = cells_[j];
    const float* dg = w.dgates[j].view().data;
    const float* x = j == 0 ? w.input.view().data : w.h[j - 1].view().data + N * Hs;  // h[j-1] at steps 1..U
    backend_.layer_gemm(true, false, 4 * Hs, cell.input, UN, 1.f, dg, 4 * Hs, x, cell.input, 0.f,
                        params_.grad(cell.w_ih).data, cell.input);
    backend_.layer_gemm(true, false, 4 * Hs, Hs, UN, 1.f, dg, 4 * Hs, w.h[j].view().data, Hs, 0.f,
                        params_.grad(cell.w_hh).data, Hs);
    backend_.sum_rows(UN, 4 * Hs, dg, params_.grad(cell.b_ih).data);
    backend_.copy(4 * Hs, params_.grad(cell.b_ih).data, params_.grad(cell.b_hh).data);
  }
  // The embedding, the cells and the output are final; the query is too, but the key, declared
  // between them, is written by listener_backward.
  gradients_final_from("speller.embedding");
  // The attention's keys and values: per utterance, sums over steps as one GEMM each.
  float* dkeys = w.dkeys.resize({N, Tl, A}).data;
  float* dvalues = w.dvalues.resize({N, Tl, C}).data;
  for (int64_t n = 0; n < N; ++n) {
    backend_.gemm(true, false, Tl, A, U, 1.f, denergy + n * Tl, N * Tl, query + n * A, N * A, 0.f,
                  dkeys + n * Tl * A, A);
    backend_.gemm(true, false, Tl, C, U, 1.f, alpha + n * Tl, N * Tl, dcontext + n * C, N * C, 0.f,
                  dvalues + n * Tl * C, C);
  }
  listener_backward();
}

std::unique_ptr<SpeechModel> make_las(Backend& backend, const LasOptions& options, uint64_t seed) {
  return std::make_unique<Las>(backend, options, seed);
}

}  // namespace trainer::models
