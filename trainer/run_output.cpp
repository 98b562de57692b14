#include "trainer/run_output.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "comm/comm_log.h"
#include "comm/comm_wait.h"
#include "comm/sync/methods/dense/dense.h"
#include "comm/sync/registry.h"
#include "comm/sync/methods/sparse/select.h"

namespace trainer::app {

void open_run_output(const Config& config, comm::Communicator& comm, bool resumed) {
  const std::string out = output_dir(config);
  if (comm.rank() == 0) {
    std::filesystem::create_directories(out + "/comm");
    std::ofstream f(out + "/config.toml");
    f << to_toml(config);
    if (!f) throw std::runtime_error(out + "/config.toml: write failed");
  }
  comm.barrier("BARRIER_SETUP");
  comm::CommLogOptions log_options;
  log_options.enabled = config.comm.log;
  log_options.path = out + "/comm/rank" + std::to_string(comm.rank()) + ".jsonl";
  log_options.first_step = config.comm.log_first_step;
  log_options.last_step = config.comm.log_last_step;
  log_options.every = config.comm.log_every;
  log_options.append = resumed;  // a resumed run continues its records
  log_options.trace_first_step = config.comm.trace_first_step;
  log_options.trace_last_step = config.comm.trace_first_step + config.comm.trace_steps - 1;
  comm.log().open(log_options, comm.rank(), comm.size());
  comm::align_log_clock(comm);  // first clock sample for the wait split and the trace
}

void write_run_info(const std::string& path, const Config& config, const models::ParameterStore& params, int world,
                    int64_t total_steps, int64_t steps_per_epoch, int64_t first_step) {
  const int64_t n = params.size();
  const int64_t bucket = comm::bucket_elements(config.sync.bucket_mb);
  // The density of a method with one (its key), which the reports read; 1 for the others.
  const bool has_density = comm::method_key(comm::sync_method(config.sync.method), "density");
  const double density = has_density ? config.sync.get<double>("density") : 1.0;
  nlohmann::json views = nlohmann::json::array();
  for (const models::ParamView& v : params.views()) views.push_back({{"name", v.name}, {"shape", v.shape}});
  nlohmann::json info{{"world_size", world},
                            {"arch", config.model.arch},
                            {"method", config.sync.method},
                            {"n", n},
                            {"density", density},
                            {"k", comm::top_k_count(density, n)},
                            {"dense_warmup_steps", config.sync.dense_warmup_steps},
                            {"bucket_elements", bucket},
                            {"dense_buckets", (n + bucket - 1) / bucket},
                            {"batch_size", config.data.batch_size},
                            {"total_steps", total_steps},
                            {"steps_per_epoch", steps_per_epoch},
                            {"first_step", first_step},
                            {"parameters", views}};
  // An elastic resume's global batch, where batch_size x world_size is not it (trainer/checkpoint/reshard.h).
  if (config.data.global_batch > 0) info["global_batch"] = config.data.global_batch;
  std::ofstream f(path);
  f << info.dump(1) << "\n";
  if (!f) throw std::runtime_error(path + ": write failed");
}

void truncate_metrics(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string kept, line;
  while (std::getline(in, line)) {
    const auto pos = line.find("\"step\":");
    if (pos != std::string::npos && std::atoll(line.c_str() + pos + 7) > step) continue;
    kept += line + "\n";
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
}

void finish_comm_log(const Config& config, comm::Communicator& comm, const std::vector<comm::TraceSpan>& spans) {
  comm.log().flush();
  comm::resolve_waits(comm);
  if (config.comm.trace_steps > 0) comm::write_chrome_trace(comm, spans, output_dir(config) + "/trace.json");
}

}  // namespace trainer::app
