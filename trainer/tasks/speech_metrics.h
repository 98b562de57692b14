// Character and word error rates (CER, WER) from Levenshtein edit distance, as speech papers
// report them: total edits over the whole test split divided by the total reference length
// (not a mean of per-utterance rates, which would overweight short utterances).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace trainer::app {

// Minimum insertions + deletions + substitutions turning a into b.
int64_t edit_distance(const std::vector<std::string>& a, const std::vector<std::string>& b);
int64_t edit_distance(const std::string& a, const std::string& b);

std::vector<std::string> split_words(const std::string& text);

// Running totals over a split; merge across ranks by summing the four counters.
struct ErrorCounts {
  int64_t char_edits = 0, chars = 0, word_edits = 0, words = 0;
  void add(const std::string& reference, const std::string& hypothesis);
  double cer() const { return chars ? static_cast<double>(char_edits) / chars : 0.0; }
  double wer() const { return words ? static_cast<double>(word_edits) / words : 0.0; }
};

}  // namespace trainer::app
