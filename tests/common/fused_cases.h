// Pointwise groups for the fuse-elementwise tests (tests/unit/fused_test.cpp on the CPU and the
// code generator, tests/gpu/fused_gpu_test.cpp on CUDA): IR text with $T for the dtype under test
// (f32, f16, bf16) and $TO for its ONNX number. Each graph fuses into at least one ampc.Fused node.
#pragma once

#include <string>
#include <vector>

namespace ampc::fusedcases {

struct Case {
  std::string name, text;
  bool needsLibdevice;  // a formula calls the CUDA math library (exp, tanh, erf, ...)
  bool positiveInputs = false;
};

inline std::string instantiate(std::string text, const std::string& t) {
  const std::string to = t == "f32" ? "1" : t == "f16" ? "10" : "16";
  for (auto [k, v] : {std::pair<std::string, std::string>{"$TO", to}, {"$T", t}})
    for (size_t at; (at = text.find(k)) != std::string::npos;) text.replace(at, k.size(), v);
  return "graph \"g\" opset 17 {\n  domain \"ampc\" 1\n" + text + "\n}\n";
}

inline std::vector<Case> cases() {
  return {
      // Softsign (no hand-written CUDA kernel: its formula is its CUDA support) scaled.
      {"softsign_scaled", "input %x : $T[8,100]\ninput %s : $T[100]\n%a : $T[8,100] = Softsign(%x)\n%y : $T[8,100] = Mul(%a, %s)\noutput %y",
       false},
      // LayerScale and a residual: a per-channel and a per-row operand, a same-shape one.
      {"layerscale_residual",
       "input %x : $T[4,16,33]\ninput %gamma : $T[33]\ninput %r : $T[4,16,33]\ninput %rows : $T[16,1]\n"
       "%m : $T[4,16,33] = Mul(%x, %gamma)\n%y : $T[4,16,33] = Add(%m, %r)\n%z : $T[4,16,33] = Sub(%y, %rows)\noutput %z",
       false},
      // ReLU's gradient with its mask written out, a constant folded into the body, two results
      // (one read inside too), and a bool result.
      {"relu_grad_two_outputs",
       "input %x : $T[64,35]\ninput %dy : $T[64,35]\nconst %zero : $T[] = [0.0]\nconst %half : $T[] = [0.5]\n"
       "%g : bool[64,35] = Greater(%x, %zero)\n%d : $T[64,35] = Where(%g, %dy, %zero)\n%q : $T[64,35] = Mul(%d, %half)\n"
       "%n : bool[64,35] = Not(%g)\n%a : bool[64,35] = And(%n, %g)\n%o : bool[64,35] = Or(%a, %g)\n"
       "output %d\noutput %q\noutput %o",
       false},
      // Casts through f32 around transcendental functions, as autocast leaves them.
      {"casts_exp_sigmoid",
       "input %x : $T[7,5,9]\ninput %b : f32[9]\n%xf : f32[7,5,9] = Cast(%x) {to = 1}\n%e : f32[7,5,9] = Exp(%xf)\n"
       "%s : f32[7,5,9] = Sigmoid(%xf)\n%p : f32[7,5,9] = Mul(%e, %s)\n%q : f32[7,5,9] = Add(%p, %b)\n"
       "%y : $T[7,5,9] = Cast(%q) {to = $TO}\noutput %y",
       true},
      // Every activation with a formula, chained.
      {"activations",
       "input %x : $T[3,130]\nconst %lo : $T[] = [-0.75]\nconst %hi : $T[] = [0.8]\n"
       "%a : $T[3,130] = HardSwish(%x)\n%b : $T[3,130] = LeakyRelu(%a) {alpha = 0.1}\n%c : $T[3,130] = Elu(%b) {alpha = 0.7}\n"
       "%d : $T[3,130] = Softplus(%c)\n%e : $T[3,130] = Mish(%d)\n%f : $T[3,130] = HardSigmoid(%e) {alpha = 0.3, beta = 0.4}\n"
       "%g : $T[3,130] = Tanh(%x)\n%h : $T[3,130] = Erf(%g)\n%i : $T[3,130] = Sin(%h)\n%j : $T[3,130] = Cos(%i)\n"
       "%k : $T[3,130] = Gelu(%x) {approximate = \"tanh\"}\n%l : $T[3,130] = ampc::Silu(%k)\n%m : $T[3,130] = Relu(%l)\n"
       "%n : $T[3,130] = Clip(%x, %lo, %hi)\n%o : $T[3,130] = Max(%f, %j, %n)\n%p : $T[3,130] = Min(%o, %m)\n"
       "%q : $T[3,130] = Sign(%x)\n%r : $T[3,130] = Abs(%x)\n%s : $T[3,130] = Neg(%r)\n%t : $T[3,130] = Add(%p, %q)\n"
       "%u : $T[3,130] = Sub(%t, %s)\n%v : $T[3,130] = PRelu(%u, %hi)\noutput %v",
       true},
      // Clip with crossed bounds (lo > hi): hi everywhere, as numpy and PyTorch (min(max(x, lo), hi)).
      {"clip_crossed_bounds",
       "input %x : $T[5,40]\nconst %lo : $T[] = [0.5]\nconst %hi : $T[] = [-0.25]\n%n : $T[5,40] = Clip(%x, %lo, %hi)\n"
       "%y : $T[5,40] = Add(%n, %x)\noutput %y",
       false},
      // Rounding, division, roots, logs and powers of positive inputs.
      {"positive_math",
       "input %x : $T[9,31]\ninput %y : $T[31]\nconst %three : $T[] = [3.0]\n"
       "%a : $T[9,31] = Sqrt(%x)\n%b : $T[9,31] = Log(%x)\n%c : $T[9,31] = Div(%a, %y)\n%d : $T[9,31] = Reciprocal(%c)\n"
       "%e : $T[9,31] = Pow(%x, %three)\n%f : $T[9,31] = Floor(%e)\n%g : $T[9,31] = Ceil(%b)\n%h : $T[9,31] = Round(%d)\n"
       "%i : $T[9,31] = Add(%f, %g)\n%j : $T[9,31] = Sub(%i, %h)\n%k : bool[9,31] = IsNaN(%b)\n"
       "output %j\noutput %k",
       true, true},
      // The backward ops of GELU (both forms) and SiLU.
      {"gelu_silu_grads",
       "input %dy : $T[2,3,4,40]\ninput %x : $T[2,3,4,40]\n"
       "%a : $T[2,3,4,40] = ampc::GeluGrad(%dy, %x) {approximate = \"none\"}\n%b : $T[2,3,4,40] = ampc::GeluGrad(%a, %x) {approximate = \"tanh\"}\n"
       "%c : $T[2,3,4,40] = ampc::SiluGrad(%b, %x)\n%d : $T[2,3,4,40] = ampc::Gelu(%c) {approximate = \"none\"}\noutput %d",
       true},
      // The trigonometric and hyperbolic family, each inside its domain, in one group.
      {"trig",
       "input %x : $T[7,33]\nconst %half : $T[] = [0.5]\n%t : $T[7,33] = Tanh(%x)\n%h : $T[7,33] = Mul(%t, %half)\n"
       "%a : $T[7,33] = Tan(%h)\n%b : $T[7,33] = Asin(%t)\n%c : $T[7,33] = Acos(%t)\n%d : $T[7,33] = Atan(%x)\n"
       "%e : $T[7,33] = Sinh(%d)\n%f : $T[7,33] = Cosh(%d)\n%g : $T[7,33] = Asinh(%x)\n%k : $T[7,33] = Acosh(%f)\n"
       "%l : $T[7,33] = Atanh(%h)\noutput %a\noutput %b\noutput %c\noutput %e\noutput %g\noutput %k\noutput %l",
       true},
      // A 5-d broadcast in the middle dims and a scalar operand.
      {"broadcast_5d",
       "input %x : $T[2,3,5,7,11]\ninput %m : $T[3,1,7,1]\ninput %s : $T[]\n"
       "%a : $T[2,3,5,7,11] = Mul(%x, %m)\n%b : $T[2,3,5,7,11] = Add(%a, %s)\n%c : $T[2,3,5,7,11] = Sub(%b, %m)\noutput %c",
       false},
  };
}

}  // namespace ampc::fusedcases
