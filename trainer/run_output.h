// The run folder, as every role shares it: config.toml, run.json, metrics.jsonl, the comm log and
// its trace, summary.json (the files are described in docs/architecture.md section 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/chrome_trace.h"
#include "comm/communicator.h"
#include "models/parameters.h"
#include "trainer/config/config.h"

namespace trainer::app {

// Collective, at every start: rank 0 creates the folder and writes config.toml; every rank opens
// its comm/rank<R>.jsonl (appending when `resumed`) and the log's clock is aligned.
void open_run_output(const Config& config, comm::Communicator& comm, bool resumed);

// run.json (rank 0, at every start): what the logs alone do not say and `trainer report` needs for
// the theoretical volumes of the sync method (n, P, k, dense buckets, the parameter shapes).
void write_run_info(const std::string& path, const Config& config, const models::ParameterStore& params, int world,
                    int64_t total_steps, int64_t steps_per_epoch, int64_t first_step);

// A resumed run continues metrics.jsonl: drop the records a killed run wrote after the checkpoint.
void truncate_metrics(const std::string& path, int64_t step);

// Collective, after training (also after --stop-after or a stop signal), on every rank of the
// world: waits from the ranks' entry times, then the trace.
void finish_comm_log(const Config& config, comm::Communicator& comm, const std::vector<comm::TraceSpan>& spans);

}  // namespace trainer::app
