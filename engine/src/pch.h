// Precompiled header of the LibTorch-using targets (a TU that parses LibTorch's headers
// itself costs 20-43 CPU-seconds here). It is <torch/types.h> (tensors, ATen's operators,
// autograd's Variable), not the whole C++ frontend of <torch/torch.h>: every TU loads the
// PCH, and the frontend's PCH is 721 MB against 458 MB, 5.5 s to load against 2.4 s
// (torch 2.14.1, GCC 12, measured 2026-11-26). A TU includes what else it uses
// (<torch/cuda.h>, <torch/csrc/autograd/custom_function.h>, <torch/nn/...>).
#pragma once
#include <torch/types.h>
