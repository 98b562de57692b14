// Listen, Attend and Spell (Chan et al. 2016) for character transcription, docs/architecture.md section 5.
//
// Listener: the features {N, T, F} as a time-major sequence -> BLSTM(F -> 2 x Hl) -> `pyramid_layers`
//   times: concatenate each pair of neighbouring frames (T -> T/2, lengths l -> l/2, an odd last
//   frame dropped) and BLSTM(4 Hl -> 2 x Hl). The listener's output h {T', N, 2 Hl} has lengths
//   l' = l >> pyramid_layers, which must be at least 1 (so an utterance needs 2^pyramid_layers frames).
// Attention (MLP-projected dot product): keys k = ReLU(key(h)), query q_t = ReLU(query(s_t)), both
//   Linear to A; energies e_tau = <q_t, k_tau> over tau < l'; alpha = softmax(e); context
//   c_t = sum_tau alpha_tau h_tau.
// Speller: at step t the input token y_in(t) (<sos> at t = 0) is embedded (E) and concatenated with
//   the previous context c_{t-1} (zero at t = 0) -> `speller_layers` LSTM cells of Hs (zero initial
//   state) -> s_t -> attention -> c_t -> logits_t = output([s_t ; c_t]) over `classes`.
// Training: targets are the transcript's ids then <eos> (L + 1 steps); with probability
//   `teacher_forcing` the next input token is the true previous one, otherwise the model's own argmax
//   (drawn per utterance and step from SpeechInput::seed; evaluation forwards always teacher-force).
//   The loss is the label-smoothed cross-entropy (PyTorch's CrossEntropyLoss(label_smoothing)), the
//   mean over all target tokens of the batch.
// Decoding: greedy, or beam search of `beam_width` hypotheses ranked by total log-probability
//   divided by their length (tokens including <eos>); up to `max_decode_steps` tokens.
//
// Parameter names and order are a PyTorch module tree of the same structure: listener.blstm and
// listener.pblstm.{k} (nn.LSTM, bidirectional), attention.query and attention.key (nn.Linear),
// speller.embedding (nn.Embedding), speller.cells.{j} (nn.LSTMCell: weight_ih, weight_hh, bias_ih,
// bias_hh), speller.output (nn.Linear). Initialization as PyTorch's defaults (embedding N(0, 1)).
// scripts/torch_speech_models.py builds the same model in torch.nn.
//
// The defaults are the an4 configuration of docs/architecture.md: 80 log-mel bins, Hl 384, 3 pyramid layers,
// A 512, E 256, 2 x 640 speller, 33 classes: 27,468,449 parameters.
#pragma once

#include <memory>
#include <vector>

#include "models/layers/lstm.h"
#include "models/speech_model.h"

namespace trainer::models {

// The output vocabulary: the 29 speech classes keep their ids (kSpeechLabels; id 0, the CTC blank,
// is never a target), then <sos> and <eos>, then two ids no transcript uses (kept so the parameter
// count is the published configuration's, which implies 33 outputs).
constexpr int32_t kLasSos = 29;
constexpr int32_t kLasEos = 30;
constexpr int64_t kLasClasses = 33;

struct LasOptions {
  int64_t feature_dim = 80;  // log-mel bins
  int64_t listener_hidden = 384;  // per direction
  int64_t pyramid_layers = 3;
  int64_t attention_dim = 512;
  int64_t embedding_dim = 256;
  int64_t speller_hidden = 640;
  int64_t speller_layers = 2;
  int64_t classes = kLasClasses;
  double teacher_forcing = 1.0;  // probability of feeding the true previous token while training
  double label_smoothing = 0.0;
  int64_t beam_width = 1;  // decode(): 1 = greedy
  int64_t max_decode_steps = 150;
};

class Las final : public SpeechModel {
 public:
  Las(Backend& backend, const LasOptions& options, uint64_t seed);
  ~Las() override;

  ParameterStore& parameters() override { return params_; }
  ParameterStore& buffers() override { return buffers_; }
  double forward(const SpeechInput& input, Mode mode) override;
  void backward() override;
  std::vector<std::vector<int32_t>> decode(const SpeechInput& input) override;
  double forward_flops() const override { return flops_; }
  // The listener's recurrences, and the speller's cells, query and output, whose weights every
  // speller step reads (backward reads the cells' and the query's again; the output's gradient
  // products run over all steps at once).
  std::vector<StreamedWeights> streamed_weights() const override;

  // Greedy decoding and beam search of a given width (width 1 gives the greedy result).
  std::vector<std::vector<int32_t>> decode_greedy(const SpeechInput& input);
  std::vector<std::vector<int32_t>> decode_beam(const SpeechInput& input, int64_t width);

  // The logits {U, N, classes} of the last forward (U = longest transcript + 1; rows past an
  // utterance's own L + 1 steps are not part of the loss) and the listener's output lengths.
  Tensor logits() const;
  const std::vector<int32_t>& listener_lengths() const { return lengths_.back(); }
  const LasOptions& options() const { return opt_; }

 private:
  struct Step;      // pointers to one speller step's inputs, states and records (las.cpp)
  struct Workspace; // per-step records of the last forward and backward scratch (las.cpp)

  void init(uint64_t seed);
  // Runs the listener on the batch and prepares what every speller step reads: the attention's keys
  // and values, and each cell's summed biases.
  void listen(const SpeechInput& input, Mode mode);
  // One speller step for `rows` rows; row r attends to utterance row_utterance[r].
  void speller_step(const Step& step, int64_t rows, const int32_t* row_utterance);
  // From the gradients of the attention's values and keys (workspace) down through the listener.
  void listener_backward();

  Backend& backend_;
  LasOptions opt_;
  ParameterStore params_{true};
  ParameterStore buffers_{false};
  std::unique_ptr<Lstm> blstm_;
  std::vector<std::unique_ptr<Lstm>> pblstm_;
  // The per-step layers are parameter ids used by GEMMs directly: a Layer object keeps one input
  // per forward, and the speller runs one forward per step.
  struct Affine {
    int weight = -1, bias = -1;
    int64_t in = 0, out = 0;
  };
  struct Cell {
    int w_ih = -1, w_hh = -1, b_ih = -1, b_hh = -1;
    int64_t input = 0;
  };
  Affine query_, key_, output_;
  int embedding_ = -1;
  std::vector<Cell> cells_;

  std::vector<std::vector<int32_t>> lengths_;  // lengths_[k]: frames after k pyramid reductions
  std::unique_ptr<Workspace> ws_;
  double flops_ = 0;
};

std::unique_ptr<SpeechModel> make_las(Backend& backend, const LasOptions& options, uint64_t seed);

}  // namespace trainer::models
