// Listen-Attend-Spell decoding: greedy and beam search over the speller, all utterances' hypotheses
// stepped together as one batch of rows. The speller runs on the backend; the beam's bookkeeping
// (scores, hypotheses, which rows survive) runs on the host from each step's logits.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "models/nets/las.h"
#include "models/nets/las_workspace.h"

namespace trainer::models {

std::vector<std::vector<int32_t>> Las::decode(const SpeechInput& input) {
  return opt_.beam_width > 1 ? decode_beam(input, opt_.beam_width) : decode_greedy(input);
}

std::vector<std::vector<int32_t>> Las::decode_greedy(const SpeechInput& input) {
  return decode_beam(input, 1);
}

std::vector<std::vector<int32_t>> Las::decode_beam(const SpeechInput& input, int64_t B) {
  if (B < 1) throw std::invalid_argument("las: beam width must be at least 1");
  listen(input, Mode::kEval);
  Workspace& w = *ws_;
  const int64_t N = input.batch, R = N * B, E = opt_.embedding_dim, C = 2 * opt_.listener_hidden,
                Hs = opt_.speller_hidden, A = opt_.attention_dim, V = opt_.classes, SC = Hs + C,
                Tl = w.values.view().dim(1);
  const size_t L = cells_.size();
  // A step reads the states of the hypotheses in [0] and writes the next states into [1]; the
  // surviving hypotheses' rows are then gathered from [1] back into [0].
  for (int b = 0; b < 2; ++b) {
    resize_owned(w.dec_h[b], L, w.backend);
    resize_owned(w.dec_c[b], L, w.backend);
    for (size_t j = 0; j < L; ++j) {
      backend_.fill(R * Hs, 0.f, w.dec_h[b][j].resize({R, Hs}).data);
      backend_.fill(R * Hs, 0.f, w.dec_c[b][j].resize({R, Hs}).data);
    }
    w.dec_sc[b].resize({R, SC});
  }
  w.dec_gates.resize({R, 4 * Hs});
  w.dec_tanh.resize({R, Hs});
  w.dec_input.resize({R, E + C});
  w.dec_query.resize({R, A});
  w.dec_alpha.resize({R, Tl});
  const float* device_logits = w.dec_logits.resize({R, V}).data;
  // Each step's logits are scored on the host: R x classes floats (a few kB) a step, small beside
  // the step itself. (A later change could take greedy decoding's argmax on the device.)
  w.dec_host_logits.resize(R * V);
  const float* logits = w.dec_host_logits.data();  // what the scoring below reads
  // Each step's input tokens and the rows the next states come from (a survivor's parent; a dead
  // row keeps its own), staged here and uploaded together.
  std::vector<int32_t>& staged = w.dec_host_ints;
  staged.assign(2 * R, 0);
  int32_t* const tokens = staged.data();
  int32_t* const source_rows = staged.data() + R;
  w.dec_ints.reserve(2 * R);
  const int32_t* device_tokens = device_ints(w.dec_ints);
  const int32_t* device_source_rows = device_tokens + R;

  constexpr double kDead = -std::numeric_limits<double>::infinity();
  std::vector<int32_t> row_utterance(R), next_tokens(R);
  std::vector<double> score(R, kDead), next_score(R);
  std::vector<std::vector<int32_t>> hyp(R), next_hyp(R);
  std::vector<int64_t> parent(R);
  for (int64_t r = 0; r < R; ++r) {
    row_utterance[r] = static_cast<int32_t>(r / B);
    if (r % B == 0) score[r] = 0.0;  // one live hypothesis per utterance at the start
    tokens[r] = kLasSos;
  }
  backend_.copy_to_device(device_ints(w.dec_ints), staged.data(), sizeof(int32_t) * R);
  struct Finished {
    double normalized;
    std::vector<int32_t> tokens;
  };
  std::vector<std::vector<Finished>> finished(N);
  std::vector<char> done(N, 0);
  std::vector<double> logp(V);
  struct Candidate {
    double score;
    int64_t row;
    int32_t token;
  };
  std::vector<Candidate> candidates;

  Step s;
  s.h_prev.resize(L), s.c_prev.resize(L), s.h.resize(L), s.c.resize(L), s.gates.resize(L), s.tanh_c.resize(L);
  // Gates and tanh(c) are scratch when nothing is kept for backward; the cells run one after
  // another, so they share them.
  constexpr int cur = 0, nxt = 1;
  for (int64_t t = 0; t < opt_.max_decode_steps; ++t) {
    s.tokens = device_tokens;
    s.context_prev = t > 0 ? w.dec_sc[cur].view().data + Hs : nullptr;
    s.context_stride = SC;
    for (size_t j = 0; j < L; ++j) {
      s.h_prev[j] = w.dec_h[cur][j].view().data;
      s.c_prev[j] = w.dec_c[cur][j].view().data;
      s.h[j] = w.dec_h[nxt][j].view().data;
      s.c[j] = w.dec_c[nxt][j].view().data;
      s.gates[j] = w.dec_gates.view().data;
      s.tanh_c[j] = w.dec_tanh.view().data;
    }
    s.input = w.dec_input.view().data;
    s.query = w.dec_query.view().data;
    s.alpha = w.dec_alpha.view().data;
    s.state_context = w.dec_sc[nxt].view().data;
    s.logits = w.dec_logits.view().data;
    speller_step(s, R, row_utterance.data());
    copy_to_host(backend_, device_logits, R * V, w.dec_host_logits.data());  // waits: `staged` is free again

    // Expand every live hypothesis; per utterance keep the best B that did not end, and set aside
    // those that ended with <eos>.
    std::fill(next_score.begin(), next_score.end(), kDead);
    for (int64_t n = 0; n < N; ++n) {
      if (done[n]) continue;
      candidates.clear();
      for (int64_t b = 0; b < B; ++b) {
        const int64_t r = n * B + b;
        if (score[r] == kDead) continue;
        const float* z = logits + r * V;
        const float top = *std::max_element(z, z + V);
        double sum = 0.0;
        for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(z[v]) - top);
        const double log_sum = top + std::log(sum);
        for (int64_t v = 0; v < V; ++v) candidates.push_back({score[r] + z[v] - log_sum, r, static_cast<int32_t>(v)});
      }
      const size_t keep = std::min<size_t>(candidates.size(), 2 * B);
      std::partial_sort(candidates.begin(), candidates.begin() + keep, candidates.end(),
                        [](const Candidate& a, const Candidate& b) { return a.score > b.score; });
      int64_t kept = 0;
      for (size_t i = 0; i < keep && kept < B; ++i) {
        const Candidate& cand = candidates[i];
        if (cand.token == kLasEos) {
          finished[n].push_back({cand.score / (hyp[cand.row].size() + 1), hyp[cand.row]});
          continue;
        }
        const int64_t r = n * B + kept++;
        next_score[r] = cand.score;
        next_tokens[r] = cand.token;
        parent[r] = cand.row;
      }
      // Done when nothing lives on; when the best extension is <eos> (every live hypothesis
      // already has a lower total log-probability, which can only fall: with width 1 this is
      // exactly greedy decoding); or when B hypotheses have ended and the best of them beats every
      // live one at its current normalized score (a cheap end test: a live hypothesis's
      // normalized score can still rise, but rarely past a finished leader).
      double best_finished = kDead, best_live = kDead;
      for (const Finished& f : finished[n]) best_finished = std::max(best_finished, f.normalized);
      for (int64_t b = 0; b < kept; ++b) {
        const int64_t r = n * B + b;
        best_live = std::max(best_live, next_score[r] / (hyp[parent[r]].size() + 2));
      }
      if (kept == 0 || (keep > 0 && candidates[0].token == kLasEos) ||
          (static_cast<int64_t>(finished[n].size()) >= B && best_finished >= best_live))
        done[n] = 1;
    }
    if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) break;
    // Gather the survivors' states (rows of [nxt]) into [cur]: the source rows go up with the next
    // tokens.
    for (int64_t r = 0; r < R; ++r) {
      const int64_t p = next_score[r] == kDead ? r : parent[r];
      source_rows[r] = static_cast<int32_t>(p);
      next_hyp[r] = hyp[p];
      if (next_score[r] != kDead) next_hyp[r].push_back(next_tokens[r]);
      tokens[r] = next_score[r] == kDead ? kLasEos : next_tokens[r];
    }
    backend_.copy_to_device(device_ints(w.dec_ints), staged.data(), sizeof(int32_t) * 2 * R);
    for (size_t j = 0; j < L; ++j) {
      backend_.gather_rows(R, Hs, device_source_rows, w.dec_h[nxt][j].view().data, w.dec_h[cur][j].view().data);
      backend_.gather_rows(R, Hs, device_source_rows, w.dec_c[nxt][j].view().data, w.dec_c[cur][j].view().data);
    }
    backend_.gather_rows(R, SC, device_source_rows, w.dec_sc[nxt].view().data, w.dec_sc[cur].view().data);
    hyp.swap(next_hyp);
    score.swap(next_score);
  }
  backend_.synchronize();  // the last upload read `staged`, which the next decode rewrites
  std::vector<std::vector<int32_t>> result(N);
  for (int64_t n = 0; n < N; ++n) {
    double best = kDead;
    for (const Finished& f : finished[n])
      if (f.normalized > best) best = f.normalized, result[n] = f.tokens;
    if (best == kDead)  // nothing ended within max_decode_steps: the best live hypothesis
      for (int64_t b = 0; b < B; ++b)
        if (const int64_t r = n * B + b; score[r] != kDead && score[r] / (hyp[r].size() + 1) > best)
          best = score[r] / (hyp[r].size() + 1), result[n] = hyp[r];
  }
  return result;
}

}  // namespace trainer::models
