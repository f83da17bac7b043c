// Normal random values that any part can be drawn of alone, as counter-based generators
// give them (Random123's Philox, which torchtitan's sharded initialisation relies on
// through DTensor): each rank draws only the part of a parameter it keeps, with the values
// one process drawing the whole would give.
#pragma once

#include <cstdint>

namespace tide {

// Elements [first, first + n) of an endless array of Normal(0, std) values fixed by `key`:
// element i is a pure function of (key, i). Philox4x32-10 at counter i / 4 gives four
// uniform words (24 bits each); two Box-Muller pairs make the four values, in float, as
// LibTorch's own normal_ computes them on the host. Runs on LibTorch's intra-op threads;
// the values do not depend on how many.
void draw_normal(uint64_t key, double std, int64_t first, float* out, int64_t n);

}  // namespace tide
