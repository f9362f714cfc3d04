// data-parallel: makes a train-step graph (passes/train_step.h) one replica of several that train
// together, each on its own share of the batch. One ampc.AllReduce (mean over the group) takes the
// loss, every gradient UnscaleCheck reads, and the running statistics of ops with state
// (BatchNorm), and the graph reads the averaged values instead (or one AllReduce per bucket of
// them, below). Everything after it (the overflow
// check, the clip, the optimizer, the scaler, the step counter) then sees the same bits on every
// replica, so every replica agrees on the loss scale and on skipping a step by construction: an
// Inf or NaN in one replica's gradients is in the sum that all of them check.
//
// The plan stays the same for any number of replicas: the runtime applies this pass when it runs
// in a group of more than one (amprun --nproc, or the torchrun environment).
#pragma once

#include <cstdint>
#include <memory>

#include "passes/pass.h"

namespace ampc {

// bucketBytes > 0: the averaged values are cut into buckets of about that many f32 bytes, in the
// order the backward makes them, one AllReduce each, placed as soon as its bucket is complete (the
// CUDA backend averages a bucket on a stream of its own while the backward goes on). 0: one
// AllReduce before UnscaleCheck.
std::unique_ptr<Pass> createDataParallelPass(int64_t bucketBytes = 0);

}  // namespace ampc
