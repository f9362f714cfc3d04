#include "runtime/cuda/nccl.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <thread>

#include "runtime/cuda/libs.h"
#include "runtime/cuda/program.h"

namespace ampc::cuda {
namespace {

// The part of NCCL's C interface that ampc calls (nccl.h, stable since NCCL 2.4): an opaque
// communicator, a 128-byte unique id, int results and enums.
using NcclResult = int;  // ncclResult_t: 0 is ncclSuccess, 7 ncclInProgress
constexpr NcclResult kNcclSuccess = 0, kNcclInProgress = 7;
constexpr int kNcclFloat32 = 7;  // ncclDataType_t
constexpr int kNcclSum = 0;      // ncclRedOp_t
struct NcclUniqueId {
  char internal[128];
};

struct NcclApi {
  NcclResult (*getVersion)(int*) = nullptr;
  NcclResult (*getUniqueId)(NcclUniqueId*) = nullptr;
  NcclResult (*commInitRank)(void**, int, NcclUniqueId, int) = nullptr;
  NcclResult (*commDestroy)(void*) = nullptr;
  NcclResult (*commAbort)(void*) = nullptr;
  NcclResult (*commGetAsyncError)(void*, NcclResult*) = nullptr;
  const char* (*getErrorString)(NcclResult) = nullptr;
  NcclResult (*allReduce)(const void*, void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  std::string error;  // why it could not be loaded
};

template <class F>
void bind(void* lib, const char* name, F& f, std::string& error) {
  f = reinterpret_cast<F>(::dlsym(lib, name));
  if (!f && error.empty()) error = std::string("libnccl.so.2 has no ") + name;
}

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    void* lib = ::dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!lib) lib = ::dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* e = ::dlerror();
      a.error = std::string("NCCL is not installed here (") + (e ? e : "libnccl.so.2 not found") +
                "); CUDA data-parallel groups need it, or run the group with --device cpu";
      return a;
    }
    bind(lib, "ncclGetVersion", a.getVersion, a.error);
    bind(lib, "ncclGetUniqueId", a.getUniqueId, a.error);
    bind(lib, "ncclCommInitRank", a.commInitRank, a.error);
    bind(lib, "ncclCommDestroy", a.commDestroy, a.error);
    bind(lib, "ncclCommAbort", a.commAbort, a.error);
    bind(lib, "ncclCommGetAsyncError", a.commGetAsyncError, a.error);
    bind(lib, "ncclGetErrorString", a.getErrorString, a.error);
    bind(lib, "ncclAllReduce", a.allReduce, a.error);
    return a;
  }();
  return api;
}

std::string ncclMessage(NcclResult r) {
  const auto& api = nccl();
  const char* s = api.getErrorString ? api.getErrorString(r) : nullptr;
  return "NCCL error " + std::to_string(r) + (s ? std::string(": ") + s : std::string());
}

}  // namespace

NcclGroup::NcclGroup(Collective& host, int device, std::chrono::milliseconds timeout)
    : rank_(host.rank()), world_(host.world()), timeout_(timeout) {
  const std::string who = "rank " + std::to_string(rank_) + " of " + std::to_string(world_);
  const auto& api = nccl();
  if (!api.error.empty()) throw Error(who + ": " + api.error);
  check(cudaSetDevice(device), who + ": cuda:" + std::to_string(device));
  NcclUniqueId id{};
  std::string bytes;
  if (rank_ == 0) {
    if (const NcclResult r = api.getUniqueId(&id); r != kNcclSuccess) throw Error(who + ": ncclGetUniqueId: " + ncclMessage(r));
    bytes.assign(id.internal, sizeof id.internal);
  }
  bytes = host.shareFromRankZero("nccl.unique_id", bytes);
  if (bytes.size() != sizeof id.internal) throw Error(who + ": the NCCL unique id from rank 0 has " + std::to_string(bytes.size()) + " bytes, not 128");
  std::memcpy(id.internal, bytes.data(), sizeof id.internal);
  if (const NcclResult r = api.commInitRank(&comm_, world_, id, rank_); r != kNcclSuccess)
    throw Error(who + ": could not join the NCCL group on cuda:" + std::to_string(device) + ": " + ncclMessage(r) +
                (world_ > 1 ? " (two ranks on one GPU? each rank takes cuda:LOCAL_RANK)" : ""));
  setStreamWaiter([this](cudaStream_t st, const char* why) { wait(st, why); });
}

NcclGroup::~NcclGroup() {
  setStreamWaiter(nullptr);
  if (comm_) nccl().commDestroy(comm_);  // an aborted communicator is gone already
}

std::string NcclGroup::version() const {
  int v = 0;
  if (nccl().getVersion) nccl().getVersion(&v);
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return "NCCL " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

void NcclGroup::abort(const std::string& why) {
  if (comm_ && !aborted_) {
    nccl().commAbort(comm_);
    aborted_ = true;
    comm_ = nullptr;
  }
  throw Error("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": " + why);
}

void NcclGroup::allReduceSum(float* data, size_t n, cudaStream_t st) {
  if (aborted_) abort("the NCCL group was aborted after an earlier failure");
  if (const NcclResult r = nccl().allReduce(data, data, n, kNcclFloat32, kNcclSum, comm_, st); r != kNcclSuccess && r != kNcclInProgress)
    abort("the gradient all-reduce failed: " + ncclMessage(r));
}

void NcclGroup::wait(cudaStream_t st, const char* why) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    const cudaError_t e = cudaStreamQuery(st);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) check(e, why);
    if (comm_) {
      NcclResult async = kNcclSuccess;
      if (nccl().commGetAsyncError(comm_, &async) == kNcclSuccess && async != kNcclSuccess && async != kNcclInProgress)
        abort(std::string(why) + ": the gradient all-reduce failed (did another rank die?): " + ncclMessage(async));
    }
    if (std::chrono::steady_clock::now() - start > timeout_)
      abort(std::string(why) + ": the step did not finish within the group's timeout of " + std::to_string(timeout_.count() / 1000.0).substr(0, 5) +
            " s (did another rank die or hang?)");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace ampc::cuda
