// Fuzz target: an AN4 split as load_an4 reads it, fileids list, transcription file and one audio
// file, through indexing, transcript parsing, audio reading and features.
// Input: <an4_train.fileids> %% <an4_train.transcription> %% <wav/a.sph bytes> (parts split by a
// "%%" line, fuzz_input.h). An odd-sized input loads with skip_bad. Errors must be one line naming a
// file under the corpus root (or the root itself when nothing is usable).
#include <stdexcept>

#include "data/an4.h"
#include "tests/fuzz/fuzz_input.h"

using namespace trainer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = fuzz::split_parts(data, size, 3);
  const std::filesystem::path root = fuzz::scratch_dir() / "an4";
  fuzz::write_file(root / "etc" / "an4_train.fileids", parts[0]);
  fuzz::write_file(root / "etc" / "an4_train.transcription", parts[1]);
  fuzz::write_file(root / "wav" / "a.sph", parts[2]);
  data::An4Options opts;
  opts.root = root.string();
  opts.skip_bad = size % 2 == 1;
  opts.threads = 1;
  std::string warnings;
  data::SpeechSet set;
  try {
    set = data::load_an4(opts, /*train=*/true, &warnings);
  } catch (const std::runtime_error& e) {
    fuzz::check_error_message(e.what(), opts.root);
    return 0;
  }
  for (const data::Utterance& u : set.utterances) {
    if (u.frames <= 0 || u.features.size() != static_cast<size_t>(u.frames) * set.feature_dim) std::abort();
    data::ctc_labels(u.transcript);  // accepted transcripts are in the vocabulary (throws otherwise)
  }
  return 0;
}
