#pragma once

#include "comm/communicator.h"
#include "data/cifar.h"
#include "data/loader.h"
#include "models/model.h"
#include "trainer/config.h"

namespace trainer::app {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t samples = 0;
};

// Test loss and accuracy over the whole split: the ranks share the images (the loader's
// sharding) and sum their counts, so every rank returns the same result.
EvalResult evaluate(models::ImageClassifier& model, const data::ImageSet& set, const data::Normalization& norm,
                    const DataConfig& d, comm::Communicator& comm);

}  // namespace trainer::app
