// Generated kernels (compiler/codegen/nvptx.h) against the CPU backend, which runs each fused
// group's ops one by one: the groups of tests/common/fused_cases.h at f32, f16 and bf16, on fresh
// random data. The kernels come from the ampc binary (`ampc CASE.ir --kernels --emit text`): $AMPC_BIN,
// else `ampc` on the PATH (the staged GPU folder), else the build's. Skips without a GPU.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>

#include "tests/common/fused_cases.h"
#include "tests/gpu/gpu_util.h"

using namespace ampc;
using namespace ampc::gputest;
namespace fs = std::filesystem;

namespace {
std::string ampcBinary() {
  if (const char* e = std::getenv("AMPC_BIN"); e && *e) return e;
  if (std::system("command -v ampc > /dev/null 2>&1") == 0) return "ampc";
  return AMPC_BIN;
}
}  // namespace

TEST(GpuFused, GeneratedKernelsMatchTheCpu) {
  AMPC_NEED_GPU();
  const fs::path dir = fs::temp_directory_path() / ("ampc_fused_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937_64 rng(std::random_device{}());
  int launched = 0;
  for (const auto& c : fusedcases::cases())
    for (const char* t : {"f32", "f16", "bf16"}) {
      SCOPED_TRACE(c.name + " " + t);
      const fs::path in = dir / (c.name + "_" + t + ".ir"), out = dir / (c.name + "_" + t + ".fused.ir");
      std::ofstream(in) << fusedcases::instantiate(c.text, t);
      const std::string cmd = ampcBinary() + " " + in.string() + " --kernels --emit text -o " + out.string() + " 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
      std::stringstream text;
      text << std::ifstream(out).rdbuf();
      auto g = parseGraph(text.str());
      g->bindOps();
      verify(*g);
      for (const auto& n : g->nodes())
        if (n->op() == "Fused") {
          EXPECT_FALSE(n->getString("ptx", "").empty()) << n->describe();
          ++launched;
        }
      std::normal_distribution<double> normal(0.0, 1.5);
      std::map<std::string, Tensor> inputs;
      for (const Value* v : g->inputs()) {
        Tensor x(v->type());
        for (int64_t i = 0; i < x.numel(); ++i) {
          const double r = normal(rng);
          x.setDouble(i, v->type().dtype == DType::boolean ? (r > 0) : c.positiveInputs ? std::fabs(r) + 0.05 : r);
        }
        inputs.emplace(v->name(), std::move(x));
      }
      expectSameOnGpu(*g, inputs, c.name + " " + t);
    }
  fs::remove_all(dir);
  EXPECT_GE(launched, 21);
}
