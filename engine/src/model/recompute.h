// Activation checkpointing: run a function without keeping its activations, and
// recompute it (with the same RNG state) when backward reaches it.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>

namespace tide {

using BlockFn = std::function<at::Tensor(const at::Tensor&)>;

// Returns fn(x); fn's parameters receive their gradients during the recomputation.
// draws_random: fn draws random numbers (dropout), so the recomputation is given the
// generator states the forward started from.
at::Tensor recompute_in_backward(BlockFn fn, const at::Tensor& x, bool draws_random);

// Whether this thread is running a function again for its backward: the graph made now is
// backpropagated at once, so a node gains nothing by keeping less and fetching it again
// in backward (context_parallel.h's gathered keys).
bool recomputing_for_backward();

}  // namespace tide
