// The dense gradient's buckets, in the order backward produces them. Layers run backward in
// reverse, so the last tensors of the flat gradient are final first: the buckets are cut from the
// end of the buffer towards its start, of whole tensors (a tensor larger than a bucket is cut into
// bucket-sized pieces, all final at once), each at most `bucket_elements` (the first at most
// `first_bucket_elements`, so that the first allreduce starts early, as DDP's 1 MB first bucket).
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
                                                  int64_t bucket_elements, int64_t first_bucket_elements);

}  // namespace trainer::comm
