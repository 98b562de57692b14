// The dense gradient's buckets, in the order backward produces them. Layers run backward in
// reverse, so the last tensors of the flat gradient are final first: the buckets are cut from the
// end of the buffer towards its start, of whole tensors, and a bucket is closed as soon as it holds
// at least `bucket_elements` (the first `first_bucket_elements`, so that the first allreduce starts
// early), so it may pass its cap by its last tensor. That is PyTorch DDP's rule, and the reason for
// it: closing before a tensor that does not fit would leave a larger last bucket, which only becomes
// ready when backward ends and cannot be hidden (ResNet-18 at 25 MB: a 19.5 MB last bucket instead
// of DDP's 8.7 MB). One difference: a tensor larger than `bucket_elements` is cut into pieces of
// that size (all final at once), so no message is larger than a bucket (DeepSpeech's LSTM weights).
// Overlapped or not, a step reduces the same buckets in the same order, so the sums are the same bits.
#pragma once

#include <cstdint>
#include <vector>

#include "models/parameters.h"

namespace trainer::comm {

struct GradientBucket {
  int64_t begin = 0, end = 0;  // elements [begin, end) of the flat gradient
  int64_t size() const { return end - begin; }
};

// `views` in store order (contiguous from offset 0, as ParameterStore declares them); null or empty:
// the buffer is cut into plain pieces from its end.
std::vector<GradientBucket> plan_gradient_buckets(int64_t n, const std::vector<models::ParamView>* views,
                                                  int64_t bucket_elements, int64_t first_bucket_elements,
                                                  bool cut_large_tensors = true);

}  // namespace trainer::comm
