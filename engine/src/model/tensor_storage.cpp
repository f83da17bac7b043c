#include "model/tensor_storage.h"

#include <ATen/ops/empty.h>
#include <c10/core/StorageImpl.h>

namespace tide {

void release_storage(const at::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

at::Tensor storageless_empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
  auto t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  auto* s = t.storage().unsafeGetStorageImpl();
  // No pointer at all (an empty tensor's may be a live zero-byte block): a read before
  // allocate_storage faults at address 0 (or fails LibTorch's data_ptr check) rather than
  // reading past the end of a live block.
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(static_cast<size_t>(t.numel()) * t.element_size());
  return t;
}

namespace {
thread_local bool deferring = false;
}  // namespace

DeferredStorage::DeferredStorage() : outer_(deferring) { deferring = true; }
DeferredStorage::~DeferredStorage() { deferring = outer_; }
bool DeferredStorage::active() { return deferring; }

at::Tensor parameter_tensor(at::IntArrayRef sizes) {
  const auto options = at::TensorOptions().dtype(at::kFloat);
  return deferring ? storageless_empty(sizes, options) : at::empty(sizes, options);
}

void allocate_storage(const at::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void borrow_storage(const at::Tensor& t, const at::Tensor& from) {
  TORCH_CHECK(from.is_contiguous() && from.numel() == t.numel() && from.scalar_type() == t.scalar_type() &&
                  from.device() == t.device(),
              "borrow_storage: ", from.sizes(), " ", from.scalar_type(), " on ", from.device(),
              " cannot be the memory of ", t.sizes(), " ", t.scalar_type(), " on ", t.device());
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(from.data_ptr(), t.device()));  // no deleter: not ours to free
  s->set_nbytes(static_cast<size_t>(t.numel()) * t.element_size());
}

}  // namespace tide
