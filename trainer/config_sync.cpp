#include "trainer/config_sync.h"

namespace trainer {

comm::SyncOptions sync_options(const Config& c) {
  comm::SyncOptions o;
  o.method = c.sync.method;
  o.dense_warmup_steps = c.sync.dense_warmup_steps;
  o.bucket_mb = c.sync.bucket_mb;
  o.first_bucket_mb = c.sync.first_bucket_mb;
  o.overlap = c.sync.overlap;
  o.wire_dtype = comm::parse_wire_dtype(c.sync.wire_dtype);
  o.period = c.sync.period;
  o.density = c.sync.density;
  o.local_threshold_every = c.sync.local_threshold_every;
  o.global_threshold_every = c.sync.global_threshold_every;
  o.region_every = c.sync.region_every;
  o.max_in_flight = c.sync.max_in_flight;
  o.balance = c.sync.balance;
  o.rank = c.sync.rank;
  o.min_compression_rate = c.sync.min_compression_rate;
  o.error_feedback = c.sync.error_feedback;
  o.keep_dense = c.sync.keep_dense;
  o.adaptive = c.sync.adaptive;
  o.adaptive_rank = c.sync.adaptive_rank;
  o.adaptive_density = c.sync.adaptive_density;
  o.adaptive_threshold = c.sync.adaptive_threshold;
  o.adaptive_interval = c.sync.adaptive_interval;
  o.seed = static_cast<uint64_t>(c.experiment.seed);
  o.servers = c.sync.servers;
  o.max_staleness = c.sync.max_staleness;
  o.staleness_lr = c.sync.staleness_lr;
  o.dc_lambda = c.sync.dc_lambda;
  o.momentum_correction = c.sync.momentum_correction;
  o.deterministic = c.sync.deterministic;
  o.outer_optimizer = c.sync.outer_optimizer;
  o.outer_lr = c.sync.outer_lr;
  o.outer_momentum = c.sync.outer_momentum;
  o.fragments = c.sync.fragments;
  o.sync_delay = c.sync.sync_delay;
  o.mixing = c.sync.mixing;
  o.outer_dtype = comm::parse_outer_dtype(c.sync.outer_dtype);
  return o;
}

}  // namespace trainer
