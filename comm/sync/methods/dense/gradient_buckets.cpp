#include "comm/sync/methods/dense/gradient_buckets.h"

#include <algorithm>

namespace trainer::comm {

std::vector<GradientBucket> plan_gradient_buckets(int64_t n, const std::vector<models::ParamView>* views,
                                                  int64_t bucket_elements, int64_t first_bucket_elements,
                                                  bool cut_large_tensors) {
  const int64_t largest = std::max<int64_t>(1, bucket_elements);
  int64_t cap = std::max<int64_t>(1, std::min(first_bucket_elements, largest));
  std::vector<GradientBucket> buckets;
  int64_t end = n, begin = n;  // the bucket being filled: [begin, end)
  auto close = [&](int64_t at) {
    buckets.push_back({at, end});
    end = at;
    cap = largest;
  };
  // Tensor starts from the last tensor to the first (one piece of n without views).
  std::vector<int64_t> starts;
  if (views && !views->empty())
    for (auto it = views->rbegin(); it != views->rend(); ++it) starts.push_back(it->offset);
  else
    starts.push_back(0);
  for (const int64_t start : starts) {
    if (start >= begin) continue;  // an empty tensor
    if (begin - start > largest && cut_large_tensors) {
      // Larger than any bucket: cut from its end into pieces of the largest size, after what the
      // bucket being filled already holds; its first piece stays open for the tensors before it.
      if (begin < end) close(begin);
      while (end - start > largest) close(end - largest);
      begin = start;
      continue;
    }
    begin = start;
    if (end - begin >= cap) close(begin);  // full: it may pass its cap by its last tensor
  }
  if (begin < end) close(begin);
  return buckets;
}

}  // namespace trainer::comm
