#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/sync/codecs/chunk_codec.h"
#include "comm/sync/methods/demo/chunk_dct.h"
#include "comm/sync/gradient_sync.h"
#include "comm/sync/option_keys.h"

namespace trainer::comm {

// DeMo, decoupled momentum (Peng, Quesnelle and Kingma 2024, arXiv 2411.19870; the reference's
// DeMo optimizer): every step each rank keeps its own momentum, sends only its fastest-moving
// components, and keeps the rest in the momentum. Per step, on rank r with gradient g_r:
//   m_r    <- beta m_r + g_r                       beta = sync.demo.error_decay (0.999 unless set, DeMo's)
//   c_r     = TopK(DCT(m_r))                       chunk_dct.h on the chunks of chunk_codec.h (tiles
//                                                  of 64 x 64, runs of 64), sync.demo.density per chunk,
//                                                  sync.demo.value_bits (32 unless set: the fp32 values)
//   m_r    <- m_r - IDCT(D(c_r))                   what went out leaves the momentum
//   g      <- sign(IDCT(sum over r in rank order of D(c_r)))   (ALLGATHER_DEMO; sign(0) = 0)
// and the config's optimizer steps with g: DeMo's update is signSGD with the optimizer's lr, so
// optim.momentum should be 0 (DeMo's momentum is m; a note says so otherwise). Every rank decodes
// the same payloads in the same order, so every rank applies the same g and the parameters stay equal.
// Differences from the reference: the momentum adds g rather than lr x g (the sign makes the scale
// moot; only a changing lr weighs the history differently), k per chunk is ceil(density x its size)
// rather than a fixed 32, and the sum over ranks replaces the mean over the ranks that sent each
// component (the sign is the same).
//
// Host memory (capability device_buffers false: a device run stages host copies, host_staged.h).
// Saved state: the momentum; on another number of ranks each new rank's is the mean of the saved
// ranks' (rank_mean.h).
struct DemoOptions {
  double density = 1.0 / 128;  // DeMo's 32 components of each 64 x 64 tile
  double error_decay = 0.999;  // DeMo's momentum decay
  int64_t value_bits = 32;     // fp32 components, as DeMo sends them

  template <class Keys>
  static void declare(Keys& k) {
    k.key("density", &DemoOptions::density,
          "fraction of each chunk's DCT components sent (tiles of 64 x 64, runs of 64). Unless set, 1/128 (DeMo's "
          "32 of each 64 x 64 tile).",
          open_closed(0, 1));
    k.key("error_decay", &DemoOptions::error_decay,
          "beta, the decay of each rank's momentum m = beta m + g. Unless set, 0.999, DeMo's.", closed(0, 1));
    k.key("value_bits", &DemoOptions::value_bits,
          "bits per sent DCT component: 32 unless set (fp32, DeMo's), or 2, 4 or 8 with a scale per chunk.",
          closed(2, 32));
  }
};

struct SyncOptionProblem;  // registry.h
// DeMo's rules between its options, asked through its spec (the config at load, make_gradient_sync).
std::vector<SyncOptionProblem> demo_problems(const DemoOptions& options);

class Demo final : public GradientSync {
 public:
  // `views`: the model's tensors (their shapes cut the chunks). `options` pass demo_problems
  // (make_gradient_sync asks them).
  Demo(Communicator& comm, models::Backend& backend, int64_t n, const std::vector<models::ParamView>* views,
       const DemoOptions& options);
  std::string name() const override { return "demo"; }
  std::string describe() const override;
  Phase phase(int64_t) const override { return Phase::kCompressed; }
  SyncStats reduce(SyncBuffers& b, int64_t step) override;
  void save(std::ostream& out) const override;
  void load(std::istream& in) override;
  std::string load_resharded(const std::vector<std::string>& states) override;

  const std::vector<float>& momentum() const { return momentum_; }  // for tests; empty before the first step
  const ChunkCodec& codec() const { return codec_; }

 private:
  Communicator& comm_;
  models::Backend& backend_;
  int64_t n_;
  DemoOptions options_;
  ChunkCodec codec_;
  ChunkDct dct_;
  std::vector<float> momentum_, components_, decoded_;
  std::vector<uint8_t> payload_, gathered_;
};

}  // namespace trainer::comm
