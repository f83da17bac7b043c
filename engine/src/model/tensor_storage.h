// A tensor's memory taken away and given back, the tensor itself (its shape, dtype,
// device, autograd identity and every view of it) kept: how ZeRO-3 holds parameters
// between their gathers, and how a model is built as shapes alone
// (ParameterStorage::Deferred) until its parameters are placed.
#pragma once

#include <ATen/core/Tensor.h>

namespace tide {

// The StorageImpl stays (tensors autograd saved keep pointing at it), without memory.
void release_storage(const at::Tensor& t);
// A tensor of `sizes` whose storage claims their bytes but has no memory: views of it
// can be cut (parameters of a ZeRO-3 unit), nothing may read it until allocate_storage.
at::Tensor storageless_empty(at::IntArrayRef sizes, const at::TensorOptions& options);
// A new fp32 host parameter of `sizes`: memory, values undefined; or, while a
// DeferredStorage lives on this thread, none (storageless_empty). A model built within
// one is shapes alone, and no part of it, not one block, is ever allocated.
at::Tensor parameter_tensor(at::IntArrayRef sizes);
class DeferredStorage {
 public:
  DeferredStorage();
  ~DeferredStorage();
  DeferredStorage(const DeferredStorage&) = delete;
  DeferredStorage& operator=(const DeferredStorage&) = delete;
  static bool active();

 private:
  bool outer_;
};

// Memory for all of t's elements again, from its storage's allocator; values undefined.
// t spans its storage (a tensor made whole, not a view).
void allocate_storage(const at::Tensor& t);
// t's storage points at the memory of `from` (contiguous, t's element count, dtype and
// device) without owning it: the caller keeps `from`'s memory until release_storage(t).
// t spans its storage.
void borrow_storage(const at::Tensor& t, const at::Tensor& from);

}  // namespace tide
