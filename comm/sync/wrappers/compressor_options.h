// The keys the compressing methods share (option_keys.h): error feedback, the tensors kept dense and
// adaptive compression (Accordion) for all of them (CompressorOptions), and the density of the
// sparse selectors, oktopk, topka, gaussiank and gtopk (SparseOptions). Each method's options struct
// derives from one of these, so a key that several methods declare is declared once.
#pragma once

#include <cstdint>
#include <string>

#include "comm/sync/option_keys.h"

namespace trainer::comm {

struct CompressorOptions {
  bool error_feedback = true;
  std::string keep_dense;  // comma-separated globs of tensor names (keep_dense.h)
  bool adaptive = false;   // Accordion (accordion.h)
  double adaptive_threshold = 0.5;  // eta
  int64_t adaptive_interval = 0;    // steps; 0: an epoch

  template <class Keys>
  static void declare(Keys& k) {
    k.key("error_feedback", &CompressorOptions::error_feedback,
          "keep what a step did not send in a residual that the next step adds back (error feedback). false is "
          "the ablation without it: what was not sent is dropped. Other methods keep no residual and ignore it.");
    k.key("keep_dense", &CompressorOptions::keep_dense,
          "parameter tensors left uncompressed and averaged exactly every step, as a comma-separated list of shell "
          "globs on their names (\"speller.*,attention.*\"; each must match a tensor). The sparse methods then "
          "select over the other entries only. Empty: every tensor the method can compress is compressed.")
        .refused_for_others = true;
    k.key("adaptive", &CompressorOptions::adaptive,
          "adaptive compression as Accordion defines it (Agarwal et al., MLSys 2021; comm/sync/wrappers/accordion.h). At "
          "the end of each interval (adaptive_interval) the norm of the interval's summed averaged gradient "
          "is compared with the previous interval's; a relative change of at least adaptive_threshold is a "
          "critical regime, and the next interval sends at the low-compression setting (adaptive_rank, "
          "adaptive_density), otherwise at rank or density. Training starts at the "
          "low-compression setting (an interval that began in the dense warmup is not measured), the interval "
          "after the first measured one is low too (nothing to compare with), and so is the interval after a "
          "learning-rate drop of optim.schedule = \"multistep\". powersgd judges each compressed tensor on its "
          "own (the paper decides per layer); the sparse methods, which select over the whole gradient with one "
          "k, judge the whole gradient. The setting in use is the metrics' low_compression field; each switch is "
          "an ADAPTIVE_SWITCH record in the comm log.")
        .refused_for_others = true;
    k.key("adaptive_threshold", &CompressorOptions::adaptive_threshold,
          "under adaptive, eta: the relative change of the interval's gradient norm, |prev - cur| / prev, "
          "from which a regime is critical (the paper's 0.5).",
          open_closed(0, 1e6));
    k.key("adaptive_interval", &CompressorOptions::adaptive_interval,
          "under adaptive, the steps per detection interval; 0 is an epoch (the paper's interval).",
          at_least(0));
  }
};

struct SparseOptions : CompressorOptions {
  double density = 0.1;           // k = ceil(density * n) entries per step
  double adaptive_density = 0.1;  // under adaptive: the density of critical regimes
  bool dgc = false;                   // Deep Gradient Compression's momentum correction (dgc.h)
  int64_t density_warmup_steps = 0;   // DGC's sparsity warm-up (dgc.h DensityWarmup); 0: off
  int64_t density_warmup_epochs = 0;  // the same in epochs (steps_per_epoch each)
  double density_warmup_start = 0.25;
  int64_t density_warmup_stages = 4;

  template <class Keys>
  static void declare(Keys& k) {
    k.key("density", &SparseOptions::density,
          "fraction of gradient entries selected per step, k = ceil(density * n). The default, 0.1, is the one "
          "measured to hold accuracy: Ok-Top-k on the CIFAR ResNet-20 recipe at P = 4 (39 dense steps first, 3 "
          "seeds) ended 0.7 points below dense at 0.1 (97.50 against 98.17%, 3.6x fewer bytes per step), 2.6 "
          "below at 0.05 and 10 below at 0.01 (BENCHMARKS.md, \"Defaults that hold accuracy\"); the Ok-Top-k "
          "paper's 0.01-0.02 suit its long runs of large models (the paper configs set them). Under adaptive "
          "0.01, paired with adaptive_density.",
          open_closed(0, 1));
    CompressorOptions::declare(k);
    k.key("adaptive_density", &SparseOptions::adaptive_density,
          "under adaptive, the density of critical regimes (above density). The paper's Top-k pairs "
          "kept 99% against 10% or 25% of each layer; 0.1 is ten times density's default under "
          "adaptive (0.01).",
          open_closed(0, 1));
    k.key("dgc", &SparseOptions::dgc,
          "Deep Gradient Compression (Lin et al., ICLR 2018; docs/methods.md): the method owns SGD's momentum "
          "(optim.momentum, optim.nesterov) and the optimizer steps without it. Each rank keeps a velocity "
          "u = m u + g, error feedback accumulates u instead of g, and u is cleared where an entry was sent "
          "(momentum factor masking). With optim.grad_clip_norm = C each rank clips its own gradient at "
          "C / sqrt(processes) before it enters u, and nothing is clipped after the sync. SGD only (an error with "
          "adam and adamw, whose moments are not a velocity the method can carry). Coupled optim.weight_decay "
          "moves into the method too, as in DGC's reference: a dense momentum of its own on lambda p, added "
          "after the sync (decoupled decay stays the optimizer's). Not with keep_dense or "
          "error_feedback = false.");
    k.key("density_warmup_steps", &SparseOptions::density_warmup_steps,
          "DGC's sparsity warm-up: the density falls exponentially from density_warmup_start to density "
          "in density_warmup_stages equal stages over the run's first N steps (a dense warmup's steps "
          "included), start * (density / start)^(i / stages) in stage i, then density. 0: off. The density in "
          "use is the metrics' density_target field. Not with adaptive, which sets the density itself.",
          at_least(0));
    k.key("density_warmup_epochs", &SparseOptions::density_warmup_epochs,
          "the sparsity warm-up's length in epochs instead of steps (DGC: 4); not together with "
          "density_warmup_steps. 0: off.",
          at_least(0));
    k.key("density_warmup_start", &SparseOptions::density_warmup_start,
          "the sparsity warm-up's first density (DGC: 0.25, above density).", open_closed(0, 1));
    k.key("density_warmup_stages", &SparseOptions::density_warmup_stages,
          "the sparsity warm-up's number of stages at constant density (DGC: 4: 25%, 6.25%, 1.56%, 0.4%, then "
          "0.1%).",
          at_least(1));
  }
};

}  // namespace trainer::comm
