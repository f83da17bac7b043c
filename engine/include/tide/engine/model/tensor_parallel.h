// Megatron-style tensor parallelism as the model sees it: this rank's share of the
// model, and the operations that join the shares. Column-parallel linears split their
// output features (attention heads, MLP hidden units), row-parallel ones their input
// features; a pair needs one all-reduce forward and one backward. With sequence
// parallelism the activations between the pairs (norms, dropout, residuals) are split
// along the sequence instead of replicated, and the all-reduces become all-gathers and
// reduce-scatters of the same volume.
//
// The model is written against TensorParallelGroup only. The parallelize step
// (parallel/parallelize.h) implements it over the tensor-parallel process group and
// hands it to the model, so nothing in model/ knows how the shares travel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tide {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Forward identity, backward all-reduce (Megatron's f): before a column-parallel
  // layer, and on a weight every rank holds whole but uses only partly.
  virtual at::Tensor copy_to(const at::Tensor& x) = 0;
  // Forward all-reduce, backward identity (Megatron's g): after a row-parallel layer.
  virtual at::Tensor reduce_from(const at::Tensor& x) = 0;
  // [B, T / tp, ...] → [B, T, ...]; backward reduce-scatters (sequence parallelism).
  virtual at::Tensor gather_sequence(const at::Tensor& x) = 0;
  // [B, T, ...] partial sums → [B, T / tp, ...] summed; backward all-gathers.
  virtual at::Tensor reduce_scatter_sequence(const at::Tensor& x) = 0;
  // No autograd: what gather_sequence and reduce_scatter_sequence do forward, for a node
  // that gathers again in its own backward (fused_ops.h: normed_projections). `what`
  // names the tensor in errors.
  virtual at::Tensor sequence_all_gather(const at::Tensor& x, const std::string& what) = 0;
  virtual at::Tensor sequence_reduce_scatter(const at::Tensor& x, const std::string& what) = 0;
  // No autograd, in place: the element-wise maximum or sum over the group's ranks (the
  // vocabulary-parallel softmax's statistics). `what` names the tensor in errors.
  virtual void all_reduce_max(at::Tensor& t, const std::string& what) = 0;
  virtual void all_reduce_sum(at::Tensor& t, const std::string& what) = 0;
  // No autograd: every rank's `local` (n elements), rank j's at chunk j of the
  // size() * n result. `what` names the tensor in errors.
  virtual at::Tensor all_gather(const at::Tensor& local, const std::string& what) = 0;
  // No autograd: `by_rank` (size() chunks of n elements) summed over the ranks, this
  // rank's chunk of the sum, n elements (all_gather's counterpart).
  virtual at::Tensor reduce_scatter_sum(const at::Tensor& by_rank, const std::string& what) = 0;
  // No autograd: `by_rank` (size() chunks of n elements, chunk j for rank j) exchanged:
  // chunk i of the result (its shape) is rank i's chunk for this rank.
  virtual at::Tensor all_to_all(const at::Tensor& by_rank, const std::string& what) = 0;
  // No autograd: `rows` cut into chunks of send_rows[j] rows (dim 0), chunk j for rank j,
  // exchanged: the result is rank i's chunk for this rank (recv_rows[i] rows), in rank
  // order (expert parallelism's dispatch).
  virtual at::Tensor all_to_all_rows(const at::Tensor& rows, const std::vector<int64_t>& send_rows,
                                     const std::vector<int64_t>& recv_rows, const std::string& what) = 0;
};

struct TensorParallel {
  std::shared_ptr<TensorParallelGroup> group;  // null: no tensor parallelism
  bool sequence_parallel = false;

  int rank() const { return group ? group->rank() : 0; }
  int size() const { return group ? group->size() : 1; }
};

// Expert parallelism as the model sees it (parallel.ep): each mixture-of-experts block
// holds experts [rank * E / size, (rank + 1) * E / size) of its E, and sends every token
// to the ranks of its chosen experts over `group` (the interface tensor parallelism's
// ranks join through; parallel/parallelize.h builds it over the expert-parallel ranks).
struct ExpertParallel {
  std::shared_ptr<TensorParallelGroup> group;  // null: every expert on this rank
  int rank() const { return group ? group->rank() : 0; }
  int size() const { return group ? group->size() : 1; }
};

// The vocabulary rounded up to a multiple of tp (each rank holds an equal slice; the
// padded rows are never looked up and their logits are masked out).
inline int64_t padded_vocab(int64_t vocab, int64_t tp) { return (vocab + tp - 1) / tp * tp; }

}  // namespace tide
