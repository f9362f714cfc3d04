// attn_bench: device time of the fused attention kernels alone (ampc.Attention and
// ampc.AttentionGrad, kernels/cuda/attention.cu) at one size, with and without their mask and
// dropout, to see what each costs. Runs on the GPU machine (staged by tools/bench/stage_gpu.sh):
//   attn_bench [--bh 96] [--seq 1024] [--dim 64] [--dtype bf16] [--reps 10]
// For each variant (no mask / causal mask, dropout 0 / 0.1) it prints the median forward and
// backward milliseconds over --reps runs (events around each node) and the TFLOP/s they reach,
// counting the causal half of the scores only where the mask is causal.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "compiler/ir/text.h"
#include "runtime/cuda/program.h"

using namespace ampc;

int main(int argc, char** argv) {
  int64_t bh = 96, seq = 1024, dim = 64;
  int reps = 10;
  std::string dtype = "bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--bh") bh = std::stoll(v);
    else if (k == "--seq") seq = std::stoll(v);
    else if (k == "--dim") dim = std::stoll(v);
    else if (k == "--dtype") dtype = v;
    else if (k == "--reps") reps = std::stoi(v);
    else {
      std::fprintf(stderr, "attn_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    for (const bool causal : {false, true})
      for (const double ratio : {0.0, 0.1}) {
        const std::string T = dtype, b = std::to_string(bh), s = std::to_string(seq), d = std::to_string(dim);
        const std::string qs = T + "[" + b + "," + s + "," + d + "]", kts = T + "[" + b + "," + d + "," + s + "]";
        const std::string m = causal ? ", %m" : "";
        const std::string attrs = " {scale = 0.125, dropout_ratio = " + std::to_string(ratio) + ", dropout_key = 7}";
        std::string text = "graph \"a\" opset 17 {\n  domain \"ampc\" 1\n";
        text += "  input %q : " + qs + "\n  input %kt : " + kts + "\n  input %v : " + qs + "\n  input %do : " + qs + "\n";
        if (causal) text += "  input %m : f32[" + s + "," + s + "]\n";
        text += "  %o : " + qs + ", %lse : f32[" + b + "," + s + "] = ampc::Attention(%q, %kt, %v" + m + ")" + attrs + " @fwd\n";
        text += "  %dq : " + qs + ", %dkt : " + kts + ", %dv : " + qs + " = ampc::AttentionGrad(%do, %q, %kt, %v, %o, %lse" + m + ")" + attrs +
                " @bwd\n";
        text += "  output %dq\n  output %dkt\n  output %dv\n}\n";
        auto g = parseGraph(text, "attn_bench");
        cuda::Program p(*g, {});
        std::mt19937_64 rng(1);
        std::normal_distribution<double> nd;
        for (const Value* v : g->inputs()) {
          Tensor x(v->type());
          for (int64_t e = 0; e < x.numel(); ++e) {
            if (v->name() == "m") x.setDouble(e, (e % seq) > (e / seq) ? -3.4028234663852886e38 : 0.0);
            else x.setDouble(e, nd(rng));
          }
          p.upload(v, x);
        }
        std::vector<double> fwd, bwd;
        for (int r = 0; r < reps + 1; ++r) {
          const auto t = p.profile();
          if (r == 0) continue;  // warm-up
          for (const auto& x : t) (x.what.find("fwd") != std::string::npos ? fwd : bwd).push_back(x.ms);
        }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v.empty() ? 0.0 : v[v.size() / 2];
        };
        const double f = median(fwd), bw = median(bwd);
        const double flops = 4.0 * static_cast<double>(bh) * static_cast<double>(seq) * static_cast<double>(seq) * static_cast<double>(dim) *
                             (causal ? 0.5 : 1.0);
        std::printf("%-6s mask %-6s dropout %.1f: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)\n", dtype.c_str(),
                    causal ? "causal" : "none", ratio, f, flops / f / 1e9, bw, 2.5 * flops / bw / 1e9);
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
