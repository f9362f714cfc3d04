// Generated CUDA kernels through LLVM's NVPTX backend (Debian's llvm-19-dev): one kernel per
// ampc.Fused node (compiler/ops/pointwise.h), ahead of time, stored in the plan as PTX that amprun
// loads with the CUDA runtime's library API.
//
// The kernel for a body over a domain of n elements (the results' shape) is
//   .entry <name>(in0, ..., in{k-1}, out0, ..., out{m-1})   (global pointers)
// a grid-stride loop over element indices (the vector entry: over chunks of V elements, with
// vector loads and stores for the operands of the domain's shape). Each operand is read at its broadcast offset (the
// domain's shape and the operand's are constants of the kernel, so the index arithmetic folds),
// widened to f32 (bool: a predicate), each body node computes its formula and is rounded to its
// result's dtype, and the results are stored in their dtypes. Transcendental functions come from
// libdevice (the CUDA toolkit's nvvm/libdevice/libdevice.10.bc), linked in and inlined.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc::codegen {

// Whether this build has the NVPTX code generator (built against LLVM).
bool available();

// The libdevice bitcode: $AMPC_LIBDEVICE, else the CUDA toolkit's found at build time, else
// /usr/local/cuda/nvvm/libdevice/libdevice.10.bc; "" when none exists (or AMPC_LIBDEVICE=none).
std::string libdevicePath();

struct Kernel {
  std::string name;  // the .entry: one element per thread per iteration
  std::string ptx;   // both entries
  int threads = 256;  // per block
  int64_t elements = 0;
  // A second entry taking `vector` consecutive elements per thread per iteration (one 16-byte
  // access for the narrowest operand of the domain's shape), where `vector` divides the elements;
  // it wants those operands and the results aligned to vector * their element size. Empty: none.
  std::string vectorName;
  int vector = 1;
};

// A group whose formulas need libdevice where none is found: it can go without a kernel (amprun
// then runs its ops one by one on CUDA).
struct NoLibdevice : Error {
  using Error::Error;
};

// The kernel of one ampc.Fused node (sm_90). Error naming the node when it cannot be generated
// (no code generator in this build; NoLibdevice for a formula needing libdevice when none is found).
Kernel fusedKernel(const Node& fused, const std::string& name);

}  // namespace ampc::codegen
