#include "comm/sync/dense.h"

#include <algorithm>
#include <sstream>

#include "comm/sync/sync_state.h"

namespace trainer::comm {

void allreduce_average(Communicator& comm, models::Backend& backend, float* data, int64_t n, int64_t bucket_elements,
                       const char* tag) {
  const float scale = 1.f / static_cast<float>(comm.size());
  for (int64_t begin = 0; begin < n; begin += bucket_elements) {
    const int64_t count = std::min(bucket_elements, n - begin);
    comm.allreduce(data + begin, count, DType::kF32, ReduceOp::kSum, tag);
  }
  // One scaling pass after all buckets: the buckets of a step are in flight back to back. On the
  // backend, where the data is (on the CPU the same element-wise product as a loop here).
  backend.scale(n, scale, data);
}

int64_t bucket_elements(double bucket_mb) {
  return std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / 4));
}

DenseSync::DenseSync(Communicator& comm, int64_t n, double bucket_mb, models::Backend& backend)
    : comm_(comm), n_(n), bucket_elements_(bucket_elements(bucket_mb)), backend_(backend) {}

std::string DenseSync::describe() const {
  const int64_t buckets = (n_ + bucket_elements_ - 1) / bucket_elements_;
  const int p = comm_.size();
  std::ostringstream out;
  out << "dense: " << buckets << " allreduce(s) ALLREDUCE_DENSE per step over " << n_ << " floats ("
      << n_ * 4 / 1e6 << " MB); ring traffic per rank 2(P-1)/P x 4n = " << 2.0 * (p - 1) / p * n_ * 4 / 1e6
      << " MB at P = " << p;
  return out.str();
}

SyncStats DenseSync::reduce(SyncBuffers& b, int64_t step) {
  comm_.log().set_step(step, Phase::kDense);
  if (comm_.size() > 1) allreduce_average(comm_, backend_, b.grads, b.n, bucket_elements_, "ALLREDUCE_DENSE");
  return {Phase::kDense, 1.0};
}

void DenseSync::save(std::ostream& out) const { write_sync_header(out, "dense", 1); }
void DenseSync::load(std::istream& in) { read_sync_header(in, "dense", 1); }

}  // namespace trainer::comm
