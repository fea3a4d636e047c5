// Precompiled header for the libtorch targets. Only heavy, stable third-party headers belong here.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>
