#include <sstream>

#include "comm/sync/methods/async_ps/async_ps_server.h"
#include "trainer/checkpoint/checkpoint_keeper.h"
#include "trainer/experiment.h"
#include "trainer/checkpoint/reshard.h"
#include "trainer/roles.h"
#include "trainer/tasks/task.h"

namespace trainer::app {

bool run_server(const Config& config, const RunOptions& options, comm::Communicator& world) {
  // A server keeps its shard, the optimizer state and the sums on the host whatever runtime.device
  // (its arithmetic is on host vectors; the workers' pushes and pulls arrive over MPI): a GPU run's
  // workers stage their pushes and pulls through host copies (comm/sync/methods/async_ps/async_ps.h).
  models::Backend& backend = models::cpu_backend();
  ModelStores model = build_model_stores(config, backend);
  comm::PsServerOptions server_options;
  server_options.sync = sync_options(config);
  server_options.eval_every_steps = config.train.eval_every_steps;
  server_options.checkpoint_every = config.train.checkpoint_every;
  server_options.optimizer = optimizer_options(config);
  server_options.schedule = schedule_options(config.optim);
  comm::ParameterServer server(server_options, world, backend, *model.params, *model.buffers);

  CheckpointKeeper keeper(config, *model.params, *model.buffers, world);
  int64_t first_step = 0;
  if (auto ck = keeper.start(options.resume)) {
    if (ck->saved.empty()) {
      std::istringstream opt_state(ck->state.optimizer_state), sync_state(ck->state.sync_state);
      server.load(opt_state, sync_state);
    } else {  // another number of processes or servers (trainer/checkpoint/reshard.h)
      apply_ps_server_resharded(*ck, server, *model.params, *model.buffers);
    }
    first_step = ck->state.step;
  }
  // The same checkpoint calls as the workers': a failed periodic one is a warning (rank 0, a
  // worker, prints it), the final one an error on every rank.
  auto checkpoint = [&](int64_t step) {
    const int64_t steps_per_epoch = std::max<int64_t>(server.steps_per_epoch(), 1);
    TrainingState state;
    state.step = step;
    state.epoch = step / steps_per_epoch;
    state.batch_in_epoch = step % steps_per_epoch;
    state.global_batch = config.data.global_batch;  // as the workers record it
    std::ostringstream opt_state, sync_state;
    server.save(opt_state, sync_state);
    state.optimizer_state = opt_state.str();
    state.sync_state = sync_state.str();
    keeper.save(state, step == server.total_steps());
  };
  return server.serve(first_step, options.stop_after, checkpoint) == server.total_steps();
}

}  // namespace trainer::app
