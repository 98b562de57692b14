#include "trainer/evaluate.h"

namespace trainer::app {

EvalResult evaluate(models::ImageClassifier& model, const data::ImageSet& set, const data::Normalization& norm,
                    const DataConfig& d, comm::Communicator& comm) {
  data::LoaderOptions opts;
  opts.batch_size = d.eval_batch_size;
  opts.shuffle = false;
  opts.augment = false;
  opts.drop_last = false;
  opts.rank = comm.rank();
  opts.world = comm.size();
  opts.threads = static_cast<int>(d.loader_threads);
  data::ImageLoader loader(set, norm, opts);
  // {loss sum, correct, samples}, summed over ranks in one small allreduce.
  double totals[3] = {0, 0, 0};
  for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
    data::Batch batch = loader.next();
    if (batch.size == 0) continue;  // a rank's share of the last, partial batch can be empty
    int64_t hits = 0;
    const double loss = model.forward(models::Tensor{batch.images.data(), {batch.size, 3, 32, 32}},
                                      batch.labels.data(), models::Mode::kEval, &hits);
    totals[0] += loss * batch.size;
    totals[1] += static_cast<double>(hits);
    totals[2] += static_cast<double>(batch.size);
  }
  comm.allreduce(totals, 3, comm::DType::kF64, comm::ReduceOp::kSum, "ALLREDUCE_EVAL");
  EvalResult r;
  r.samples = static_cast<int64_t>(totals[2]);
  r.loss = r.samples ? totals[0] / r.samples : 0;
  r.accuracy = r.samples ? totals[1] / r.samples : 0;
  return r;
}

}  // namespace trainer::app
