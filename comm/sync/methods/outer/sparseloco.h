#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/sync/codecs/chunk_codec.h"
#include "comm/sync/option_keys.h"
#include "comm/sync/methods/outer/outer_loop.h"
#include "models/device_buffer.h"

namespace trainer::comm {

// SparseLoCo (Sarfi, Therien, Lidin and Belilovsky 2025, arXiv 2508.15706): DiLoCo's schedule
// (diloco.h: H = sync.sparseloco.period inner steps with the config's optimizer, Streaming DiLoCo's fragments
// and delay) with the pseudo-gradient sent sparse and in a few bits, and DiLoCo's outer momentum
// replaced by each rank's error-feedback accumulator. A sync of fragment f, on rank r:
//   1. tau = sync.sparseloco.sync_delay steps before its turn:
//        delta_r = theta_outer - theta_local                    (the pseudo-gradient)
//        e_r    <- beta e_r + delta_r                            (beta = sync.sparseloco.error_decay)
//        c_r     = C(e_r)                                        (chunk_codec.h: chunk-wise top-k,
//                                                                 sync.sparseloco.density, sync.sparseloco.value_bits)
//        e_r    <- e_r - D(c_r)                                  (what was not sent stays owed)
//      and the payloads c_1..c_P are exchanged (ALLGATHER_SPARSELOCO: an allgather, since ranks keep
//      different entries; every payload of one fragment has the same size);
//   2. at its turn: every rank decodes the P payloads in rank order and adds them in float32,
//        theta_outer <- theta_outer - (alpha / P) sum_r D(c_r)   (alpha = sync.sparseloco.outer_lr)
//      and the fragment's local parameters become theta_outer.
// So every rank sums the same values in the same order: the sum is exact over what was sent, and
// theta_outer is the same on every rank, bit for bit. There is no outer momentum (the paper's point:
// the decayed accumulator plays its part); the outer step is plain SGD on the mean.
// Batch-norm running statistics are averaged (ALLREDUCE_BN_STATS) with every sync of the last
// fragment, i.e. every H steps, as diloco does.
//
// The exchange with tau > 0 runs on OuterTransfer's thread during the tau steps (sync.overlap;
// outer_transfer.h), as diloco's allreduce does: the same calls on the same bytes either way.
//
// Communication per sync of a fragment of n_f entries in C chunks keeping K entries: each rank's
// payload is 4 C + ceil(12 K / 8) + ceil(b K / 8) bytes, and the allgather sends it to the P - 1
// others (a ring: (P - 1) x payload per rank). At density 2% and 2 bits that is about 0.036 n_f
// bytes per payload against DiLoCo's 4 n_f bytes of fp32 (107x on ResNet-20), or at P = 4 0.11 n_f sent per rank
// against the fp32 ring allreduce's 6 n_f (54x).
//
// Memory: theta_outer and the accumulator (2n floats), one fragment's payloads (P of them).
//
// Saved state: the schedule's keys and the codec's (checked on load), the inner step count,
// theta_outer, this rank's accumulator, and a fragment in flight (the P payloads gathered), so a
// checkpoint anywhere resumes bit for bit. On another number of ranks (load_resharded) the shared
// state must agree across the saved ranks and each new rank's accumulator is the mean of the saved
// ranks' (rank_mean.h), as error feedback keeps what the average update still owes.
//
// Device buffers (capability device_buffers): theta_outer, the accumulator and the fragment's
// pseudo-gradient live on the run's backend, and the element-wise steps above are its ops (subtract,
// scale, add, copy: CUDA kernels on a GPU). The codec runs on the host, on a copy of the fragment's
// accumulator (out and back once per sync; the decoded sum in once): its payloads are a few percent
// of the fragment and cross the network from host memory (over MPI: Communicator::host_side), so a
// step between syncs copies nothing, where host staging (host_staged.h) would copy the parameters
// and the gradient every step. Same bits as on the CPU: the same ops and the same host code.
// sync.method = "sparseloco"'s keys: the schedule's (outer_loop.h: H = 8 unless set, as diloco) and
// its codec's and outer step's.
struct SparseLocoOptions : OuterScheduleOptions {
  double outer_lr = 1.0;   // the paper's alpha (plain SGD on the mean: no momentum to damp)
  double density = 0.02;   // inside the paper's 1-3%
  double error_decay = 0.95;
  int64_t value_bits = 2;

  template <class Keys>
  static void declare(Keys& k) {
    OuterScheduleOptions::declare(k);
    k.key("outer_lr", &SparseLocoOptions::outer_lr,
          "alpha: theta_outer -= alpha x the mean of the ranks' decoded sparse updates. Unless set, 1, the "
          "paper's.",
          open_closed(0, 1e6));
    k.key("density", &SparseLocoOptions::density,
          "fraction of each chunk's entries sent, k = ceil(density x chunk size) per chunk of up to 4,096 (64 x 64 "
          "tiles of matrices, runs of vectors). Unless set, 0.02 (the paper's range is 1-3%).",
          open_closed(0, 1));
    k.key("error_decay", &SparseLocoOptions::error_decay,
          "beta, the decay of each rank's error-feedback accumulator: e = beta x e + pseudo-gradient before "
          "compressing (0.95, the paper's; it stands in for DiLoCo's outer momentum).",
          closed(0, 1));
    k.key("value_bits", &SparseLocoOptions::value_bits,
          "bits per sent value: 2 (sparseloco's default, the paper's), 4 or 8, uniform levels over [-max, max] of "
          "each chunk's sent values with one fp32 scale per chunk; or 32, the fp32 values themselves (demo's "
          "default, the DeMo paper's).",
          closed(2, 32));
  }
};

struct SyncOptionProblem;  // registry.h
// SparseLoCo's rules between its options (the fragment schedule, the value bits), stated once and
// asked through the method's spec (the config at load, make_gradient_sync before it builds).
std::vector<SyncOptionProblem> sparseloco_problems(const SparseLocoOptions& options);

class SparseLoco final : public OuterLoop {
 public:
  // `views`: the model's tensors (their shapes cut the chunks; null: one vector). `backend`: where
  // the parameters live (host or device memory; see above). `bucket_elements`: the BN statistics'
  // allreduce pieces. `options` pass sparseloco_problems (make_gradient_sync asks them).
  SparseLoco(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
             const SparseLocoOptions& options, int64_t bucket_elements, bool overlap);
  ~SparseLoco() override { end_transfer(); }
  std::string name() const override { return "sparseloco"; }
  std::string describe() const override;
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::string load_resharded(const std::vector<std::string>& states) override;

  // For tests: this rank's accumulator (a host copy; empty before the first step) and each
  // fragment's codec.
  std::vector<float> accumulator() const { return models::host_copy(accumulator_); }
  const ChunkCodec& codec(int f) const { return codecs_[static_cast<size_t>(f)]; }

 private:
  struct State;  // what save() writes (sparseloco.cpp)
  State read_state(std::istream& in) const;
  void adopt(State&& s);
  // Step 1 above: e updated, the fragment's payload encoded and its allgather started. Step 2.
  void send(const SyncBuffers& b, const Fragment& fragment, int f, int64_t step) override;
  void apply(SyncBuffers& b, const Fragment& fragment, int f) override;
  void start_outer() override;  // e = 0
  const char* exchange() const override { return "allgather"; }

  const SparseLocoOptions options_;
  std::vector<ChunkCodec> codecs_;  // one per fragment
  models::DeviceBuffer accumulator_;  // e_r over the whole model; empty until the first step
  models::DeviceBuffer update_;       // a fragment's pseudo-gradient, then its decoded sum
  std::vector<float> host_;           // the codec's side: a fragment's accumulator, or its sum
  int in_flight_ranks_ = 0;           // how many payloads the fragment in flight has (P when it was sent)
  std::vector<uint8_t> payload_;      // this rank's payload
  // Every rank's, in rank order. The exchange writes it: ~SparseLoco ends the exchange before it goes.
  std::vector<uint8_t> gathered_;
};

}  // namespace trainer::comm
