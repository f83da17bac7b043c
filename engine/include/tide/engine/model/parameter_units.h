// The model's parameters grouped into units that are used together (parameter_names.h:
// ParameterUnitLayout): the embeddings, each block, the final norm and head. A parameter
// owner that keeps only a shard of each unit (ZeRO-3) is told when a unit is about to be
// used and when it is done, so that it can materialise the unit just in time and free it
// after.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

#include "tide/engine/model/parameter_names.h"

namespace tide {


class ParameterUnits {
 public:
  virtual ~ParameterUnits() = default;
  // Before the forward of `unit` (0 at the start of a forward pass, the head's unit
  // before the final norm).
  virtual void before_forward(int unit) = 0;
  // After the forward of the embeddings (unit 0) or of a block produced `y`. Returns y,
  // for a block wrapped when autograd records so that before_backward(unit) runs just
  // before the block's backward begins.
  virtual at::Tensor after_forward(int unit, const at::Tensor& y) = 0;
  virtual void before_backward(int unit) = 0;
  // A forward pass without autograd is over (evaluation, sampling): every unit may go.
  virtual void end_forward() = 0;
};

// y unchanged, with a node in the graph that calls units.before_backward(unit) when
// backward reaches it.
at::Tensor call_before_backward(const at::Tensor& y, ParameterUnits& units, int unit);

}  // namespace tide
