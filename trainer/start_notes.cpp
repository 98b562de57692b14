#include "trainer/start_notes.h"

#include <algorithm>
#include <sstream>

#include "comm/sync/registry.h"
#include "models/speech_model.h"

namespace trainer::app {
namespace {

std::string str(double v) {
  std::ostringstream s;
  s << v;  // 0.9, not to_string's 0.900000
  return s.str();
}

// A speech model compressed after a short dense warmup ended 10 to 20 CER points behind dense on
// the LAS quickstart; a fifth of the run dense, with PowerSGD at rank 8 instead of 2 or with the
// decoder kept dense, closed nearly all of it (BENCHMARKS.md, "Methods that sync rarely, on speech"
// and "Which of LAS's tensors").
std::string short_warmup_note(const Config& config, int64_t total_steps) {
  const auto& speech = models::speech_model_names();
  const bool is_speech = std::find(speech.begin(), speech.end(), config.model.arch) != speech.end();
  const int64_t warmup = config.sync.dense_warmup_steps;
  const bool compresses = comm::sync_method(config.sync.method).can.compresses;
  // An image model compressed from its first step: issue 33's runs on CIFAR-10 (ResNet-20, 4 ranks,
  // 6 epochs) ended 6 and 14 points below dense; the CIFAR studies dense-warm a twelfth of the run.
  if (!is_speech && compresses && warmup == 0)
    return "note: " + config.sync.method + " from the first step (sync.dense_warmup_steps = 0): on CIFAR-10 "
           "(ResNet-20, 4 processes, 6 epochs) compressed runs without a dense warmup ended 6 to 14 points below "
           "dense's 71.4% (powersgd 65.4%, oktopk 57.7%); this project's CIFAR studies run a twelfth of the steps "
           "dense first (BENCHMARKS.md)";
  const bool high_rank = config.sync.method == "powersgd" && config.sync.rank >= 8;
  if (!is_speech || !compresses || high_rank || warmup * 10 >= total_steps) return "";
  return "note: " + config.sync.method + " after " + std::to_string(warmup) +
         " dense steps (sync.dense_warmup_steps) of " + std::to_string(total_steps) +
         ": on the LAS quickstart, compressed runs this short of dense ended 10 to 20 CER points behind dense's "
         "16.8% (Ok-Top-k 1% 36.8%, PowerSGD rank 2 38.6%); a fifth of the run dense gave 27.1% and 26.4%, "
         "and with it PowerSGD at rank 8 17.5%, or rank 2 with the decoder kept dense (sync.keep_dense) 18.5% "
         "(BENCHMARKS.md)";
}

// DiLoCo's outer momentum 0.9 is the paper's, for AdamW inner steps. On top of SGD with momentum
// 0.9 inside, the two compound: at H = 8, outer momentum 0.5 instead ended 6.7 points better on
// CIFAR (ResNet-20) and 11 CER points better on LAS, both within 2 points of dense (BENCHMARKS.md,
// "Methods that sync rarely"). The default is 0.5 over SGD momentum now (config_defaults.h); a run set
// to 0.9 there gets this note.
std::string diloco_momentum_note(const Config& config) {
  const auto& s = config.sync;
  const auto& o = config.optim;
  if (s.method != "diloco" || s.outer_optimizer == "adam" || s.outer_momentum < 0.9 || o.name != "sgd" || o.momentum < 0.9)
    return "";
  return "note: diloco with outer momentum " + str(s.outer_momentum) + " (sync.outer_momentum; the paper's, for "
         "AdamW inner steps) over SGD momentum " + str(o.momentum) + ": at H = 8, outer momentum 0.5 ended at "
         "96.1% against 89.4% on CIFAR (ResNet-20; dense 97.8%) and at CER 17.7% against 28.7% on the LAS "
         "quickstart (dense 16.8%) (BENCHMARKS.md)";
}

}  // namespace

std::vector<std::string> start_notes(const Config& config, int64_t total_steps) {
  std::vector<std::string> notes;
  for (std::string note : {short_warmup_note(config, total_steps), diloco_momentum_note(config)})
    if (!note.empty()) notes.push_back(std::move(note));
  return notes;
}

}  // namespace trainer::app
