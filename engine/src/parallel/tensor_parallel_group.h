// The model's tensor-parallel operations (model/tensor_parallel.h) over a Comm: the
// autograd functions that all-reduce, all-gather and reduce-scatter between the ranks
// that share one layer.
#pragma once

#include <memory>

#include "tide/engine/model/tensor_parallel.h"

namespace tide {

class Comm;

// `comm` must outlive the group and every autograd graph built through it.
std::shared_ptr<TensorParallelGroup> tensor_parallel_group(Comm& comm);

}  // namespace tide
