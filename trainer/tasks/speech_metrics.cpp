#include "trainer/tasks/speech_metrics.h"

#include <algorithm>
#include <sstream>

namespace trainer::app {
namespace {

// One row of the dynamic programme at a time: O(|a| |b|) time, O(|b|) memory.
template <class Seq>
int64_t levenshtein(const Seq& a, const Seq& b) {
  std::vector<int64_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    int64_t diagonal = row[0];
    row[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      const int64_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

}  // namespace

int64_t edit_distance(const std::vector<std::string>& a, const std::vector<std::string>& b) { return levenshtein(a, b); }
int64_t edit_distance(const std::string& a, const std::string& b) { return levenshtein(a, b); }

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

void ErrorCounts::add(const std::string& reference, const std::string& hypothesis) {
  char_edits += edit_distance(reference, hypothesis);
  chars += static_cast<int64_t>(reference.size());
  const auto ref_words = split_words(reference);
  word_edits += edit_distance(ref_words, split_words(hypothesis));
  words += static_cast<int64_t>(ref_words.size());
}

}  // namespace trainer::app
