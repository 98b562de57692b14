#include "comm/sync/gradient_buckets.h"

#include <algorithm>

namespace trainer::comm {

std::vector<GradientBucket> plan_gradient_buckets(int64_t n, const std::vector<models::ParamView>* views,
                                                  int64_t bucket_elements, int64_t first_bucket_elements) {
  std::vector<GradientBucket> buckets;
  int64_t cap = std::max<int64_t>(1, std::min(first_bucket_elements, bucket_elements));
  int64_t end = n, begin = n;  // the bucket being filled: [begin, end)
  auto close = [&](int64_t at) {
    buckets.push_back({at, end});
    end = at;
    cap = std::max<int64_t>(1, bucket_elements);
  };
  // Tensor starts from the last tensor to the first (one piece of n without views).
  std::vector<int64_t> starts;
  if (views && !views->empty())
    for (auto it = views->rbegin(); it != views->rend(); ++it) starts.push_back(it->offset);
  else
    starts.push_back(0);
  for (const int64_t start : starts) {
    if (start >= begin) continue;  // an empty tensor
    if (begin < end && end - start > cap) close(begin);  // the tensor does not fit: the bucket is done
    begin = start;
    while (end - begin > cap) close(end - cap);  // a tensor larger than a bucket
  }
  if (begin < end) close(begin);
  return buckets;
}

}  // namespace trainer::comm
