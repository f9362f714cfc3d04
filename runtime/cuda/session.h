// The CUDA backend's TrainSession (runtime/session.h).
#pragma once

#include <memory>

#include "runtime/session.h"

namespace ampc::cuda {

std::unique_ptr<TrainSession> openCudaSession(Graph& g, const SessionOptions& o);

}  // namespace ampc::cuda
