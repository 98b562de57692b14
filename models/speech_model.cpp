#include "models/speech_model.h"

#include <stdexcept>

#include "models/nets/deepspeech.h"
#include "models/nets/las.h"

namespace trainer::models {

void SpeechModel::gradients_final_from(const std::string& prefix) {
  if (!gradient_ready_) return;
  for (const ParamView& v : parameters().views())
    if (v.name == prefix || v.name.compare(0, prefix.size() + 1, prefix + ".") == 0) {
      gradient_ready_(v.offset);
      return;
    }
  throw std::logic_error("speech model: no tensor named " + prefix + ".*");
}

const std::vector<std::string>& speech_model_names() {
  static const std::vector<std::string> names{"deepspeech", "las"};
  return names;
}

std::unique_ptr<SpeechModel> make_speech_model(const std::string& arch, Backend& backend, uint64_t seed) {
  if (arch == "deepspeech") return make_deepspeech(backend, DeepSpeechOptions{}, seed);
  if (arch == "las") return make_las(backend, LasOptions{}, seed);
  std::string known;
  for (const auto& name : speech_model_names()) known += (known.empty() ? "" : ", ") + name;
  throw std::invalid_argument("unknown speech model '" + arch + "' (known: " + known + ")");
}

}  // namespace trainer::models
