// Which backends this build has, and opening a train-step graph on one. The one place that knows
// whether CUDA was built (AMPC_CUDA_BUILT): amprun and the tests go through here.
#include "runtime/session.h"

#if AMPC_CUDA_BUILT
#include "runtime/cuda/program.h"
#include "runtime/cuda/session.h"
#endif

namespace ampc {

namespace {
bool gpu() {
#if AMPC_CUDA_BUILT
  return cuda::gpuPresent();
#else
  return false;
#endif
}
bool isCudaName(const std::string& d) {
  return d == "cuda" || (d.rfind("cuda:", 0) == 0 && d.size() > 5 && d.find_first_not_of("0123456789", 5) == std::string::npos);
}
}  // namespace

std::string defaultDevice() { return gpu() ? "cuda" : "cpu"; }

std::string deviceUnavailable(const std::string& device) {
  if (device == "cpu") return "";
  if (!isCudaName(device)) return "--device " + device + ": want cpu, cuda or cuda:N";
  if (!AMPC_CUDA_BUILT) return "--device " + device + ": this amprun was built without CUDA";
  if (!gpu()) return "--device " + device + ": no CUDA device is present";
  return "";
}

std::unique_ptr<TrainSession> openTrainSession(Graph& g, const SessionOptions& o) {
  if (const std::string why = deviceUnavailable(o.device); !why.empty()) throw Error(why);
  if (o.device == "cpu") return openCpuSession(g, o);
#if AMPC_CUDA_BUILT
  return cuda::openCudaSession(g, o);
#else
  throw Error("--device " + o.device + ": this amprun was built without CUDA");
#endif
}

}  // namespace ampc
