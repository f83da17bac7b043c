// Collectives of one process group, over c10d (Gloo, or NCCL between CUDA ranks), with a
// timeout on every operation. Every dtype travels as it is (bf16 included); a tensor on
// another device than the backend's (a CUDA tensor on Gloo, a host tensor on NCCL)
// travels through a copy.
#pragma once

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tide {

// A collective that failed or timed out, naming the group, its ranks and the operation.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A collective started without waiting; wait() throws CommError like the blocking calls.
class PendingCollective {
 public:
  virtual ~PendingCollective() = default;
  virtual void wait() = 0;
};

class Comm {
 public:
  struct Impl;
  explicit Comm(std::unique_ptr<Impl> impl);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  const std::string& name() const;
  int rank() const;  // within the group
  int size() const;
  const std::vector<int>& ranks() const;  // global ranks, in group order

  // `what` names the operation in errors ("grad bucket 3").
  void all_reduce_sum(at::Tensor& t, const std::string& what);
  void all_reduce_max(at::Tensor& t, const std::string& what);
  // fp32/fp64 tensors only; `t` must stay alive and untouched until wait() returns.
  std::unique_ptr<PendingCollective> all_reduce_sum_async(at::Tensor t, const std::string& what);
  void broadcast(at::Tensor& t, int root, const std::string& what);
  // Root's `text` on every rank (control messages); other ranks' `text` is ignored.
  std::string broadcast_text(const std::string& text, int root, const std::string& what);
  // input: size() * n elements (chunk j goes to group rank j); output: n elements, the
  // sum of every rank's chunk for this rank. The output may be this rank's chunk of
  // the input.
  void reduce_scatter_sum(const at::Tensor& input, at::Tensor& output, const std::string& what);
  // input: n elements; output: size() * n, rank j's input at chunk j.
  void all_gather(const at::Tensor& input, at::Tensor& output, const std::string& what);
  // The same, started without waiting: the output is complete when wait() returns, and
  // both tensors must stay alive and untouched until then.
  std::unique_ptr<PendingCollective> reduce_scatter_sum_async(const at::Tensor& input, at::Tensor output,
                                                              const std::string& what);
  std::unique_ptr<PendingCollective> all_gather_async(const at::Tensor& input, at::Tensor output,
                                                      const std::string& what);
  // input: size() chunks of n elements, chunk j going to group rank j; output: size()
  // chunks of n, chunk i from rank i (DeepSpeed-Ulysses' exchange of heads for tokens).
  void all_to_all(const at::Tensor& input, at::Tensor& output, const std::string& what);
  // The same with uneven chunks of rows (dim 0): input's first send_rows[0] rows go to
  // group rank 0, the next send_rows[1] to rank 1, ...; output gets recv_rows[i] rows
  // from rank i, in rank order (each rank's send_rows[j] is rank j's recv_rows[it]:
  // expert parallelism's dispatch of tokens to the ranks of their experts).
  void all_to_all_rows(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& send_rows,
                       const std::vector<int64_t>& recv_rows, const std::string& what);
  void barrier(const std::string& what);
  // Point to point within the group (pipeline stages). A send completes in the
  // background: `t` must stay alive and untouched until wait(). recv blocks until `t`
  // (contiguous, of the sent shape and dtype) holds the data. Messages between two
  // ranks with the same tag arrive in the order sent.
  std::unique_ptr<PendingCollective> send(const at::Tensor& t, int dst, int tag, const std::string& what);
  void recv(at::Tensor& t, int src, int tag, const std::string& what);

  // Bytes this rank has sent through this group (payload, by the algorithm's count).
  int64_t bytes_sent() const;
  // Seconds the host has spent blocked waiting for this group's operations: on Gloo the
  // communication a step could not hide; on NCCL only where the host waits (the device's
  // own waits on its stream are not seen here).
  double wait_seconds() const;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide
