// The CIFAR-10 image models, with PyTorch's state_dict names of the reference implementations
// (akamaster/pytorch_resnet_cifar10 for ResNet-20/32/56; kuangliu/pytorch-cifar for ResNet-18 and
// VGG-16), so weights interchange and parameter counts can be checked against them.
#include <stdexcept>

#include "models/layers/batch_norm.h"
#include "models/layers/conv2d.h"
#include "models/layers/flatten.h"
#include "models/layers/linear.h"
#include "models/layers/pool2d.h"
#include "models/model.h"
#include "models/nets/basic_block.h"

namespace trainer::models {
namespace {

// He et al. 2016, section 4.2: 3x3 conv 16, three stages of n blocks (16, 32, 64), option-A
// shortcuts, global average pool, Linear(64 -> classes). Depth = 6n + 2.
void build_resnet_cifar(ImageClassifier& m, int blocks_per_stage, int64_t classes, bool frozen) {
  LayerContext ctx = m.context();
  m.add(std::make_unique<Conv2d>(ctx, "conv1", Conv2dOptions{3, 16, 3, 3, 1, 1, 1, 1, false, /*start_bf16=*/true}));
  m.add(std::make_unique<BatchNorm2d>(ctx, "bn1", BatchNormOptions{16, 1e-5f, 0.1f, true, frozen}));
  int64_t in = 16;
  const int64_t widths[3] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage) {
    for (int b = 0; b < blocks_per_stage; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      const Shortcut sc = (stride != 1 || in != widths[stage]) ? Shortcut::kOptionA : Shortcut::kIdentity;
      m.add(std::make_unique<BasicBlock>(ctx, "layer" + std::to_string(stage + 1) + "." + std::to_string(b), in,
                                         widths[stage], stride, sc, frozen));
      in = widths[stage];
    }
  }
  m.add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kAverage, 1, 1, 0, /*global=*/true}));
  m.add(std::make_unique<Flatten>(ctx));
  m.add(std::make_unique<Linear>(ctx, "linear", 64, classes));
}

// ResNet-18 for CIFAR: 3x3 stem, no max-pool, [2, 2, 2, 2] blocks of 64..512 with 1x1 conv + BN
// projection shortcuts, 4x4 average pool, Linear(512 -> classes).
void build_resnet18(ImageClassifier& m, int64_t classes, bool frozen) {
  LayerContext ctx = m.context();
  m.add(std::make_unique<Conv2d>(ctx, "conv1", Conv2dOptions{3, 64, 3, 3, 1, 1, 1, 1, false, /*start_bf16=*/true}));
  m.add(std::make_unique<BatchNorm2d>(ctx, "bn1", BatchNormOptions{64, 1e-5f, 0.1f, true, frozen}));
  int64_t in = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int b = 0; b < 2; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      const Shortcut sc = (stride != 1 || in != widths[stage]) ? Shortcut::kProjection : Shortcut::kIdentity;
      m.add(std::make_unique<BasicBlock>(ctx, "layer" + std::to_string(stage + 1) + "." + std::to_string(b), in,
                                         widths[stage], stride, sc, frozen));
      in = widths[stage];
    }
  }
  m.add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kAverage, 4, 4, 0, false}));
  m.add(std::make_unique<Flatten>(ctx));
  m.add(std::make_unique<Linear>(ctx, "linear", 512, classes));
}

// Under runtime.precision = bf16 on the CPU each network keeps its activations in bf16 from its first
// convolution (Conv2dOptions::start_bf16) to the Flatten before the classifier (tensor.h, DType).

// VGG-16 with batch norm (Simonyan & Zisserman 2015; CIFAR variant): 13 conv3x3 with bias, each
// + BN + ReLU, five max-pools, Linear(512 -> classes). Names follow nn.Sequential indices.
void build_vgg16(ImageClassifier& m, int64_t classes, bool frozen) {
  LayerContext ctx = m.context();
  const int cfg[] = {64, 64, -1, 128, 128, -1, 256, 256, 256, -1, 512, 512, 512, -1, 512, 512, 512, -1};
  int64_t in = 3;
  int index = 0;  // position in PyTorch's `features` Sequential (conv, bn, relu = 3 entries; pool = 1)
  for (int c : cfg) {
    if (c < 0) {
      m.add(std::make_unique<Pool2d>(ctx, Pool2dOptions{PoolKind::kMax, 2, 2, 0, false}));
      index += 1;
      continue;
    }
    m.add(std::make_unique<Conv2d>(ctx, "features." + std::to_string(index),
                                   Conv2dOptions{in, c, 3, 3, 1, 1, 1, 1, true, /*start_bf16=*/index == 0}));
    m.add(std::make_unique<BatchNorm2d>(ctx, "features." + std::to_string(index + 1),
                                        BatchNormOptions{c, 1e-5f, 0.1f, true, frozen}));
    index += 3;
    in = c;
  }
  m.add(std::make_unique<Flatten>(ctx));
  m.add(std::make_unique<Linear>(ctx, "classifier", 512, classes));
}

}  // namespace

const std::vector<std::string>& image_model_names() {
  static const std::vector<std::string> names{"resnet20", "resnet32", "resnet56", "resnet18", "vgg16"};
  return names;
}

std::unique_ptr<ImageClassifier> make_image_model(const ModelOptions& options, Backend& backend, uint64_t seed) {
  auto m = std::make_unique<ImageClassifier>(backend, options.arch, options.label_smoothing);
  const std::string& a = options.arch;
  const bool frozen = options.freeze_batchnorm;
  if (a == "resnet20") build_resnet_cifar(*m, 3, options.num_classes, frozen);
  else if (a == "resnet32") build_resnet_cifar(*m, 5, options.num_classes, frozen);
  else if (a == "resnet56") build_resnet_cifar(*m, 9, options.num_classes, frozen);
  else if (a == "resnet18") build_resnet18(*m, options.num_classes, frozen);
  else if (a == "vgg16") build_vgg16(*m, options.num_classes, frozen);
  else throw std::invalid_argument("unknown image model '" + a + "'");
  m->finish(seed);
  return m;
}

}  // namespace trainer::models
