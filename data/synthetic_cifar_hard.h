// The hard variant of the synthetic CIFAR-10 (data.synthetic_variant = "hard"): the same ten classes
// as the easy one, drawn so that a ResNet-20 in the 6-epoch recipe lands near real CIFAR-10's
// accuracy instead of near 100% (calibration: docs/running.md, "Data").
//
// What makes it hard, each a property of real photographs the easy variant lacks:
// - clutter: up to two smaller distractor objects, each drawn as another class would be, so every
//   shape and texture also appears in images of other labels and the model must find the main object;
// - shared parts: pattern classes (stripes, checker) come as patches of any solid outline, solid
//   classes are sometimes filled with a dotted texture that belongs to no class, and the shape knobs
//   reach towards their neighbours (rounded squares, thick rings, merging blobs, fat crosses);
// - intra-class variation: scale, aspect, warp, wider orientation wobble;
// - occlusion: a bar in front of the object for some images;
// - optics: low contrast, a Gaussian blur and stronger pixel noise.
// Colour carries no label information (the hue is uniform for every class).
#pragma once

#include <cstdint>

#include "data/synthetic_canvas.h"

namespace trainer::data::synthetic {

// Draws one hard image of class `label` (0-9, kSyntheticCifarClasses) from rng and writes its three
// 1024-byte planes (R, G, B) to out. Every draw comes from rng, in a fixed order.
void render_hard_image(int label, Rng& rng, uint8_t* out);

}  // namespace trainer::data::synthetic
