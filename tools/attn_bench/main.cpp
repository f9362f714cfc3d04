// attn_bench: device time of the fused attention kernels alone (ampc.Attention and
// ampc.AttentionGrad, kernels/cuda/attention.cu) at one size, with and without their mask and
// dropout, to see what each costs. Runs on the GPU machine (staged by tools/bench/stage_gpu.sh):
//   attn_bench [--bh 96] [--seq 1024] [--dim 64] [--dtype bf16] [--reps 10] [--layout contiguous|gpt2|gqa] [--kv-heads N]
//              [--attention auto|kernels|cudnn] [--mask all|none|causal] [--dropout all|0|0.1]
// --layout gpt2 (with --heads, default 12; bh = batch x heads): the operands as GPT-2 exports them,
// split from one [B, T, 3 H D] projection and transposed to heads, O transposed back and the
// gradients concatenated; the CUDA backend reads and writes them in place (runtime/folds.h), so
// this times the strided kernels (K as rows) that GPT-2 runs. --layout gqa: Llama's grouped-query
// attention, --kv-heads K/V heads (default --heads / 4) repeated to --heads as Hugging Face's
// repeat_kv exports them, read in place. --attention: ampc's kernels, cuDNN's fused SDPA
// (runtime/cuda/cudnn_sdpa.h; no dropout, the causal mask a constant), or the faster (auto).
// --mask and --dropout keep one variant of each (for a profiler's launch count).
// For each variant (no mask / causal mask, dropout 0 / 0.1) it prints the median forward and
// backward milliseconds over --reps runs (events around each node, after 0.3 s of warm-up runs) and
// the TFLOP/s they reach, counting the causal half of the scores only where the mask is causal.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "compiler/ir/text.h"
#include "compiler/target.h"
#include "passes/pass.h"
#include "runtime/cuda/program.h"

using namespace ampc;

int main(int argc, char** argv) {
  int64_t bh = 96, seq = 1024, dim = 64, heads = 12;
  int reps = 10;
  int64_t kvHeads = 0;  // --layout gqa: K/V heads (default --heads / 4)
  std::string dtype = "bf16", layout = "contiguous", attention = "auto", maskOnly = "all", dropoutOnly = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--bh") bh = std::stoll(v);
    else if (k == "--seq") seq = std::stoll(v);
    else if (k == "--dim") dim = std::stoll(v);
    else if (k == "--dtype") dtype = v;
    else if (k == "--reps") reps = std::stoi(v);
    else if (k == "--heads") heads = std::stoll(v);
    else if (k == "--layout") layout = v;
    else if (k == "--kv-heads") kvHeads = std::stoll(v);
    else if (k == "--attention") attention = v;
    else if (k == "--mask") maskOnly = v;
    else if (k == "--dropout") dropoutOnly = v;
    else {
      std::fprintf(stderr, "attn_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (kvHeads == 0) kvHeads = std::max<int64_t>(heads / 4, 1);
  if ((layout != "contiguous" && layout != "gpt2" && layout != "gqa") || heads < 1 || bh % heads != 0 || kvHeads < 1 || heads % kvHeads != 0 ||
      (attention != "auto" && attention != "kernels" && attention != "cudnn") || (maskOnly != "all" && maskOnly != "none" && maskOnly != "causal") ||
      (dropoutOnly != "all" && dropoutOnly != "0" && dropoutOnly != "0.1")) {
    std::fprintf(stderr,
                 "attn_bench: --layout is contiguous, gpt2 or gqa, --bh a multiple of --heads, --heads of --kv-heads; --attention auto, kernels "
                 "or cudnn; --mask all, none or causal; --dropout all, 0 or 0.1\n");
    return 2;
  }
  const auto impl = attention == "kernels" ? cuda::ProgramOptions::Attention::kernels
                    : attention == "cudnn" ? cuda::ProgramOptions::Attention::cudnn
                                           : cuda::ProgramOptions::Attention::automatic;
  try {
    for (const bool causal : {false, true})
      for (const double ratio : {0.0, 0.1}) {
        if ((maskOnly != "all" && (maskOnly == "causal") != causal) || (dropoutOnly != "all" && (dropoutOnly == "0.1") != (ratio > 0.0))) continue;
        const std::string T = dtype, b = std::to_string(bh), s = std::to_string(seq), d = std::to_string(dim);
        const std::string qs = T + "[" + b + "," + s + "," + d + "]", kts = T + "[" + b + "," + d + "," + s + "]";
        const std::string m = causal ? ", %m" : "";
        const std::string attrs = " {scale = 0.125, dropout_ratio = " + std::to_string(ratio) + ", dropout_key = 7}";
        std::string text = "graph \"a\" opset 17 {\n  domain \"ampc\" 1\n";
        text += "  input %q : " + qs + "\n  input %kt : " + kts + "\n  input %v : " + qs + "\n  input %do : " + qs + "\n";
        if (causal) text += "  const %m : f32[" + s + "," + s + "] = ...\n";
        text += "  %o : " + qs + ", %lse : f32[" + b + "," + s + "] = ampc::Attention(%q, %kt, %v" + m + ")" + attrs + " @fwd\n";
        text += "  %dq : " + qs + ", %dkt : " + kts + ", %dv : " + qs + " = ampc::AttentionGrad(%do, %q, %kt, %v, %o, %lse" + m + ")" + attrs +
                " @bwd\n";
        text += "  output %dq\n  output %dkt\n  output %dv\n}\n";
        if (layout == "gpt2") {
          const std::string B = std::to_string(bh / heads), H = std::to_string(heads), C = std::to_string(heads * dim);
          const std::string bthd = T + "[" + B + "," + s + "," + H + "," + d + "]", bhtd = T + "[" + B + "," + H + "," + s + "," + d + "]",
                            bhdt = T + "[" + B + "," + H + "," + d + "," + s + "]", btc = T + "[" + B + "," + s + "," + C + "]";
          const std::string mask = causal ? ", %m" : "";
          text = "graph \"a\" opset 17 {\n  domain \"ampc\" 1\n  input %x : " + T + "[" + B + "," + s + "," + std::to_string(3 * heads * dim) +
                 "]\n  input %dy : " + btc + "\n";
          if (causal) text += "  const %m : f32[" + s + "," + s + "] = ...\n";
          text += "  const %s4 : i64[4] = [" + B + ", " + s + ", " + H + ", " + d + "]\n  const %s3 : i64[3] = [" + B + ", " + s + ", " + C + "]\n";
          text += "  const %sp : i64[3] = [" + C + ", " + C + ", " + C + "]\n";
          text += "  %q : " + btc + ", %k : " + btc + ", %v : " + btc + " = Split(%x, %sp) {axis = 2}\n";
          for (const char* w : {"q", "k", "v"}) text += "  %" + std::string(w) + "r : " + bthd + " = Reshape(%" + w + ", %s4)\n";
          text += "  %Q : " + bhtd + " = Transpose(%qr) {perm = [0, 2, 1, 3]}\n  %KT : " + bhdt + " = Transpose(%kr) {perm = [0, 2, 3, 1]}\n";
          text += "  %V : " + bhtd + " = Transpose(%vr) {perm = [0, 2, 1, 3]}\n";
          text += "  %O : " + bhtd + ", %lse : f32[" + B + "," + H + "," + s + "] = ampc::Attention(%Q, %KT, %V" + mask + ")" + attrs + " @fwd\n";
          text += "  %Ot : " + bthd + " = Transpose(%O) {perm = [0, 2, 1, 3]}\n  %Or : " + btc + " = Reshape(%Ot, %s3)\n";
          text += "  %dyr : " + bthd + " = Reshape(%dy, %s4)\n  %dO : " + bhtd + " = Transpose(%dyr) {perm = [0, 2, 1, 3]}\n";
          text += "  %dQ : " + bhtd + ", %dKT : " + bhdt + ", %dV : " + bhtd + " = ampc::AttentionGrad(%dO, %Q, %KT, %V, %O, %lse" + mask + ")" +
                  attrs + " @bwd\n";
          text += "  %dQt : " + bthd + " = Transpose(%dQ) {perm = [0, 2, 1, 3]}\n  %dKt : " + bthd + " = Transpose(%dKT) {perm = [0, 3, 1, 2]}\n";
          text += "  %dVt : " + bthd + " = Transpose(%dV) {perm = [0, 2, 1, 3]}\n";
          for (const char* w : {"dQ", "dK", "dV"}) text += "  %" + std::string(w) + "r : " + btc + " = Reshape(%" + w + "t, %s3)\n";
          text += "  %dx : " + T + "[" + B + "," + s + "," + std::to_string(3 * heads * dim) + "] = Concat(%dQr, %dKr, %dVr) {axis = 2}\n";
          text += "  output %Or\n  output %dx\n}\n";
        }
        if (layout == "gqa") {  // Llama's: K and V repeated over head groups as Hugging Face's repeat_kv exports it
          const std::string B = std::to_string(bh / heads), H = std::to_string(heads), Hk = std::to_string(kvHeads),
                            G = std::to_string(heads / kvHeads);
          const std::string bhtd = T + "[" + B + "," + H + "," + s + "," + d + "]", bhdt = T + "[" + B + "," + H + "," + d + "," + s + "]",
                            kv = T + "[" + B + "," + Hk + "," + s + "," + d + "]", kv5 = T + "[" + B + "," + Hk + ",1," + s + "," + d + "]",
                            kvx = T + "[" + B + "," + Hk + "," + G + "," + s + "," + d + "]";
          const std::string mask = causal ? ", %m" : "";
          text = "graph \"a\" opset 18 {\n  domain \"ampc\" 1\n  input %q : " + bhtd + "\n  input %k : " + kv + "\n  input %v : " + kv +
                 "\n  input %do : " + bhtd + "\n";
          if (causal) text += "  const %m : f32[" + s + "," + s + "] = ...\n";
          text += "  const %ax : i64[1] = [2]\n  const %s5 : i64[5] = [" + B + ", " + Hk + ", " + G + ", " + s + ", " + d + "]\n";
          text += "  const %s4 : i64[4] = [" + B + ", " + H + ", " + s + ", " + d + "]\n";
          for (const char* w : {"k", "v"}) {
            const std::string x = w;
            text += "  %" + x + "u : " + kv5 + " = Unsqueeze(%" + x + ", %ax)\n  %" + x + "e : " + kvx + " = Expand(%" + x + "u, %s5)\n";
            text += "  %" + x + "r : " + bhtd + " = Reshape(%" + x + "e, %s4)\n";
          }
          text += "  %kt : " + bhdt + " = Transpose(%kr) {perm = [0, 1, 3, 2]}\n";
          text += "  %o : " + bhtd + ", %lse : f32[" + B + "," + H + "," + s + "] = ampc::Attention(%q, %kt, %vr" + mask + ")" + attrs + " @fwd\n";
          text += "  %dq : " + bhtd + ", %dkt : " + bhdt + ", %dv : " + bhtd + " = ampc::AttentionGrad(%do, %q, %kt, %vr, %o, %lse" + mask + ")" +
                  attrs + " @bwd\n  %dk : " + bhtd + " = Transpose(%dkt) {perm = [0, 1, 3, 2]}\n  output %o\n  output %dq\n  output %dk\n  output %dv\n}\n";
        }
        auto g = parseGraph(text, "attn_bench");
        if (causal) {  // the causal mask, a constant as the exporters leave it
          Tensor m(g->lookup("m")->type());
          for (int64_t e = 0; e < m.numel(); ++e) m.setDouble(e, (e % seq) > (e / seq) ? -3.4028234663852886e38 : 0.0);
          g->lookup("m")->setData(m);
        }
        createAttentionInPlacePass(findTarget("cuda"))->run(*g);  // as the CUDA lowering runs it: the gpt2 layout's views go
        cuda::ProgramOptions po;
        po.attention = impl;
        cuda::Program p(*g, po);
        std::mt19937_64 rng(1);
        std::normal_distribution<double> nd;
        for (const Value* v : g->inputs()) {
          Tensor x(v->type());
          for (int64_t e = 0; e < x.numel(); ++e) x.setDouble(e, nd(rng));
          p.upload(v, x);
        }
        std::vector<double> fwd, bwd;
        // Warm-up: module load, and the SM clock up from idle (0.3 s of back-to-back runs).
        for (const auto t0 = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(300);)
          p.profile();
        for (int r = 0; r < reps; ++r) {
          const auto t = p.profile();
          for (const auto& x : t) {  // the two attention nodes (other nodes: the gpt2 layout's Reshape of dy)
            if (x.what.find("fwd") != std::string::npos) fwd.push_back(x.ms);
            else if (x.what.find("bwd") != std::string::npos) bwd.push_back(x.ms);
          }
        }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v.empty() ? 0.0 : v[v.size() / 2];
        };
        const double f = median(fwd), bw = median(bwd);
        const double flops = 4.0 * static_cast<double>(bh) * static_cast<double>(seq) * static_cast<double>(seq) * static_cast<double>(dim) *
                             (causal ? 0.5 : 1.0);
        std::printf("%-6s %s mask %-6s dropout %.1f: forward %.3f ms (%.0f TFLOP/s), backward %.3f ms (%.0f TFLOP/s)\n", dtype.c_str(),
                    layout.c_str(), causal ? "causal" : "none", ratio, f, flops / f / 1e9, bw, 2.5 * flops / bw / 1e9);
        for (const auto& [shape, pick] : p.attentionPicks())
          std::printf("  %s: %s\n", shape.c_str(), pick.c_str());
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attn_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
