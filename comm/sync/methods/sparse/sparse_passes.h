// The passes of a sparse step over gradient-sized buffers, wherever those live (docs/architecture.md
// section 4, "Where the sparse methods compute"). The four whole-gradient sparse methods (oktopk,
// topka, gaussiank, gtopk) touch the gradient, error feedback's residual and the dense output only
// through these few calls; everything else they do is on lists of about k entries (regions, sums
// in rank order, thresholds, balancing, the exchanges), which stays on the host and goes over MPI.
//
// Two implementations, chosen with the method's backend (make_sparse_passes):
//   host    the CPU's vectorized passes (select.h) on the host residual, with its deferred clears:
//           the code the methods ran before the device seam, bit for bit;
//   device  backend ops (backend.h, "Sparse gradient sync") on a residual in device memory: an
//           exact radix select over the float bits (256-bin histograms, 8 bits a round, each read
//           back: 1 KB), stream compaction of the selected (index, value) pairs in index order into
//           device lists copied to the host (the packed payload: 8 bytes per entry), and the output
//           scattered from a list uploaded back. The selections are the host's exactly: acc is one
//           float add per entry, the threshold is the exact k-th largest magnitude (the host finds
//           the same one by sampling first), and the rules that break ties run on the host lists.
//           GaussianK's moments are sums in double in another order, so its fitted threshold may
//           differ from the host's in its last bits.
// Per step the calls come in the methods' order: first one that forms acc = grad + residual
// (select_at_least, select_top_k or moments), then any selections of the formed acc, then the
// output and the report of what this rank contributed (write_output with `mine`, or sent()).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/sync/wrappers/error_feedback.h"
#include "comm/sync/methods/sparse/select.h"
#include "models/backend.h"

namespace trainer::comm {

class SparsePasses {
 public:
  virtual ~SparsePasses() = default;
  // A step over `grad` (the SyncBuffers' gradient, in the backend's memory), whose output is
  // written back into it; `ef`: the step's error feedback.
  virtual void begin(float* grad, ErrorFeedback::Step& ef) = 0;
  // select.h's select_at_least of acc: the entries with |acc| >= lo, in index order, into `out`.
  virtual int64_t select_at_least(float lo, SparseList& out) = 0;
  // select.h's select_top_k of acc (both rules, the same threshold and list).
  virtual float select_top_k(int64_t k, bool exactly_k, SparseList& out) = 0;
  // GaussianK's fit: acc formed now, its mean and unbiased standard deviation (as torch.std).
  void moments(double& mean, double& stddev);
  // The output: grad = runs / divisor at their indices, 0 elsewhere (runs as write_sparse_output's).
  // With `mine` (this rank's selection, index-sorted), the entries of it in the output are what
  // this rank contributed: cleared from the residual; returns how many (else 0).
  virtual int64_t write_output(const std::vector<ListRef>& runs, float divisor, const SparseList* mine) = 0;
  // These entries went out whole: residual 0 there (index-sorted or not).
  virtual void sent(const int32_t* index, int64_t count) = 0;

 protected:
  explicit SparsePasses(int64_t n) : n_(n) {}
  // acc formed now; sums[0] = sum acc, sums[1] = sum acc^2 (Backend::accumulate_moments).
  virtual void accumulate_moments(double* sums) = 0;
  const int64_t n_;  // gradient entries
};

// `backend`: where the method's buffers live; a host backend gets the host passes.
std::unique_ptr<SparsePasses> make_sparse_passes(models::Backend& backend, int64_t n);
// The device passes on any backend (device_sparse_passes.cpp); tests run them on the CPU's.
std::unique_ptr<SparsePasses> make_device_sparse_passes(models::Backend& backend, int64_t n);

}  // namespace trainer::comm
