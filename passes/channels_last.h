// Channels-last placement (an analysis for the CUDA backend, pure IR): which 4-d values a backend
// should store NHWC. See placeChannelsLast.
#pragma once

#include <set>

#include "compiler/ir/ir.h"

namespace ampc {

// Convolutions on tensor cores want NHWC; with NCHW tensors cuDNN transposes around every call.
// The 4-d activations of a convolutional network are stored channels-last (the IR's shapes stay
// NCHW: only the bytes move) when every op that touches them has an NHWC form: a component of
// values that must share a layout (an elementwise op's full-shape operands and result, a batch
// norm's x / y / dy / dx, a max pool's x / y / indices and the ScatterAddFlat of its gradient) is
// channels-last when none of them is pinned to NCHW (a graph input or output, a broadcast operand,
// an op without an NHWC form) and a convolution that runs NHWC (nhwcConv) reads or writes one of
// them. A convolution converts an operand of the other layout (runtime/cuda/program.cpp).
std::set<const Value*> placeChannelsLast(const Graph& g);

// A 4-d value whose layout matters: spatial size above one, channels a multiple of 8 (the
// vectorised NHWC kernels) and at most 2048 (their per-block channel tables).
bool layoutCandidate(const Value* v);

// A convolution (Conv or ampc.ConvGrad) that runs NHWC on cuDNN: 2 spatial dims, one group, f16/bf16,
// no bias, output channels a multiple of 8 (input channels that are not get padded).
bool nhwcConv(const Node& n);

}  // namespace ampc
