// sync.<method>.keep_dense: parameter tensors that a compressing method leaves uncompressed, averaged exactly
// every step (docs/architecture.md section 4, "Tensors kept dense"). The knob that asks which of a
// model's tensors a compressor can afford to approximate: on the LAS quickstart, for example, the
// attention and the speller are a quarter of the gradient, and keeping them dense took PowerSGD
// rank 2 from 26.4 to 18.5 % CER (BENCHMARKS.md, "Which of LAS's tensors").
//
// PowerSGD takes the match per tensor itself (a kept tensor joins the 1-D tensors it already sends
// dense, in the same allreduce as Q). The whole-gradient sparse methods (oktopk, topka, gaussiank,
// gtopk) select over one flat vector, so KeepDenseSync runs such a method on the gradient with the
// kept tensors cut out (its k, thresholds and residual are over the remaining entries only) and
// then averages the kept tensors as dense sync does (allreduce_average, ALLREDUCE_DENSE in the comm
// log, within the step's compressed phase). The output is the same on every rank, as without it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/sync/wrappers/error_feedback_sync.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/registry.h"

namespace trainer::comm {

// Per view: whether its name matches one of `patterns`, a comma-separated list of shell globs
// (fnmatch: * and ? and [...]; "speller.*,attention.*"). Throws std::invalid_argument naming the
// key and the pattern when a pattern matches no tensor, so a typo is never silently a no-op.
std::vector<bool> match_keep_dense(const std::string& patterns, const std::vector<models::ParamView>& views);

// The spec of a whole-gradient sparse method (oktopk, topka, gaussiank, gtopk): it compresses, takes
// device buffers (its gradient-sized passes run on the backend, sparse_passes.h; its lists go over
// `comm`, which moves host memory), except with sync.<method>.keep_dense, sync.<method>.adaptive or a 16-bit
// sync.wire_dtype, whose gathers, detector and casts are host loops (needs_host_buffers: host
// copies on a device). Its factory applies
// sync.<method>.error_feedback and, with sync.<method>.keep_dense, runs the method built by
// make(options, comm, count, backend) on the `count` entries not kept, inside KeepDenseSync.
using SparseFactory = std::function<std::unique_ptr<ErrorFeedbackSync>(const SyncOptions&, Communicator&, int64_t count,
                                                                      models::Backend& backend)>;
SyncMethod sparse_method(std::string name, std::string doc, SparseFactory make);

class KeepDenseSync final : public GradientSync {
 public:
  // make_method(count) builds the compressing method for a gradient of `count` entries. Throws
  // std::invalid_argument when `kept` keeps every tensor or none.
  // `backend`: a host backend (the kept values live in host vectors).
  KeepDenseSync(Communicator& comm, models::Backend& backend, const std::vector<models::ParamView>& views,
                const std::vector<bool>& kept,
                const std::function<std::unique_ptr<GradientSync>(int64_t)>& make_method, double bucket_mb,
                WireDType wire);
  std::string name() const override { return method_->name(); }
  std::string describe() const override;
  Phase phase(int64_t step) const override { return method_->phase(step); }
  // The compressed entries' method's (the kept tensors' dense allreduce comes on top).
  WireVolume wire_volume() const override { return method_->wire_volume(); }
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  void complete_in_flight() override { method_->complete_in_flight(); }
  std::string overlap_plan() const override { return method_->overlap_plan(); }
  // The state is the method's (its residual covers the compressed entries only); the dense part has none.
  void save(std::ostream& out) const override { method_->save(out); }
  void load(std::istream& in) override { method_->load(in); }
  std::string load_resharded(const std::vector<std::string>& states) override {
    return method_->load_resharded(states);
  }

  // Elements [offset, offset + count) of the flat gradient, adjacent tensors merged.
  struct Range {
    int64_t offset = 0, count = 0;
  };
  // The gradient cut in two: the kept tensors and the rest, each in model order.
  struct Split {
    std::vector<Range> kept, compressed;
    int64_t kept_count = 0, compressed_count = 0;
  };

 private:
  Communicator& comm_;
  models::Backend& backend_;
  Split split_;  // before the members sized from it
  std::unique_ptr<GradientSync> method_;
  int64_t bucket_elements_;
  WireDType wire_;
  std::vector<float> kept_values_, compressed_values_;  // the two parts, gathered
};

}  // namespace trainer::comm
