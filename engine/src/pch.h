// Precompiled header of the LibTorch-using targets (a TU with <torch/torch.h> costs
// 20-29 CPU-seconds here without it).
#pragma once
#include <torch/torch.h>
