// CER and WER: edit distances on known cases and corpus-level totals.
#include <catch2/catch.hpp>

#include "trainer/tasks/speech_metrics.h"

using namespace trainer::app;

TEST_CASE("Edit distance counts insertions, deletions and substitutions", "[speech][metrics]") {
  CHECK(edit_distance(std::string("KITTEN"), std::string("SITTING")) == 3);
  CHECK(edit_distance(std::string(""), std::string("ABC")) == 3);
  CHECK(edit_distance(std::string("ABC"), std::string("")) == 3);
  CHECK(edit_distance(std::string("SAME"), std::string("SAME")) == 0);
  CHECK(edit_distance(split_words("R O B E R T"), split_words("R O B A R T")) == 1);
  CHECK(edit_distance(split_words("FIVE SIX SEVEN"), split_words("FIVE SEVEN")) == 1);
}

TEST_CASE("CER and WER are totals over the split, not means of per-utterance rates", "[speech][metrics]") {
  ErrorCounts counts;
  counts.add("YES", "YES");              // 3 chars, 1 word, no errors
  counts.add("R O B", "R O");            // 5 chars: 2 edits (" B"); 3 words: 1 deletion
  CHECK(counts.chars == 8);
  CHECK(counts.char_edits == 2);
  CHECK(counts.cer() == Approx(2.0 / 8));
  CHECK(counts.words == 4);
  CHECK(counts.word_edits == 1);
  CHECK(counts.wer() == Approx(1.0 / 4));
}
