// The training step's kernels against references written here: SGD (Nesterov, weight decay),
// LAMB's trust ratio, a skipped step passing everything through bitwise, and the LR schedules.
#include <gtest/gtest.h>

#include <cmath>

#include "compiler/ir/text.h"
#include "runtime/evaluator.h"

using namespace ampc;

namespace {

std::vector<Tensor> run(const std::string& body, const std::map<std::string, std::vector<double>>& data) {
  auto g = parseGraph("graph \"t\" opset 17 {\n  domain \"ampc\" 1\n" + body + "\n}\n", "t");
  for (Value* p : g->params()) p->setData(Tensor::fromDoubles(p->type().dtype, p->type().shape, data.at(p->name())));
  auto backend = createCpuBackend();
  return evaluate(*g, {}, *backend);
}

const char* kSgd = R"(  param %p : f32[3]
  param %g : f32[3]
  param %buf : f32[3]
  param %lr : f32[]
  param %skip : bool[]
  %p2 : f32[3], %b2 : f32[3] = ampc::SGD(%p, %g, %buf, %lr, %skip) {momentum = 0.9, nesterov = 1, weight_decay = 0.1}
  output %p2
  output %b2)";

}  // namespace

TEST(TrainOps, SgdNesterovWithWeightDecay) {
  const std::vector<double> p = {1, -2, 0.5}, g = {0.3, 0.1, -0.2}, buf = {0.05, -0.1, 0};
  auto out = run(kSgd, {{"p", p}, {"g", g}, {"buf", buf}, {"lr", {0.1}}, {"skip", {0}}});
  for (int i = 0; i < 3; ++i) {
    const double d = g[i] + 0.1 * p[i], b = 0.9 * buf[i] + d, step = d + 0.9 * b;
    EXPECT_NEAR(out[1].getDouble(i), b, 1e-6);
    EXPECT_NEAR(out[0].getDouble(i), p[i] - 0.1 * step, 1e-6);
  }
  // found_inf: parameters and state pass through bitwise.
  auto skipped = run(kSgd, {{"p", p}, {"g", {NAN, 1, 1}}, {"buf", buf}, {"lr", {0.1}}, {"skip", {1}}});
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(skipped[0].getDouble(i), static_cast<double>(static_cast<float>(p[i])));
    EXPECT_EQ(skipped[1].getDouble(i), static_cast<double>(static_cast<float>(buf[i])));
  }
}

// Without momentum SGD keeps no buffer (one result), as PyTorch's: p -= lr (g + wd p); a skipped
// step passes p through bitwise; momentum without a buffer is refused, naming the node.
TEST(TrainOps, SgdWithoutMomentumHasNoBuffer) {
  const char* body = R"(  param %p : f32[3]
  param %g : f32[3]
  param %lr : f32[]
  param %skip : bool[]
  %p2 : f32[3] = ampc::SGD(%p, %g, _, %lr, %skip) {weight_decay = 0.1}
  output %p2)";
  const std::vector<double> p = {1, -2, 0.5}, g = {0.3, 0.1, -0.2};
  auto out = run(body, {{"p", p}, {"g", g}, {"lr", {0.1}}, {"skip", {0}}});
  ASSERT_EQ(out.size(), 1u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(out[0].getDouble(i), p[i] - 0.1 * (g[i] + 0.1 * p[i]), 1e-6);
  auto skipped = run(body, {{"p", p}, {"g", {NAN, 1, 1}}, {"lr", {0.1}}, {"skip", {1}}});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(skipped[0].getDouble(i), static_cast<double>(static_cast<float>(p[i])));
  try {
    run(R"(  param %p : f32[3]
  param %g : f32[3]
  param %lr : f32[]
  param %skip : bool[]
  %p2 : f32[3] = ampc::SGD(%p, %g, _, %lr, %skip) {momentum = 0.9} @sgd_no_buffer
  output %p2)",
        {{"p", p}, {"g", g}, {"lr", {0.1}}, {"skip", {0}}});
    FAIL() << "momentum without a buffer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sgd_no_buffer"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("momentum buffer"), std::string::npos) << e.what();
  }
}

TEST(TrainOps, LambTrustRatio) {
  const std::vector<double> p = {1, -2, 0.5, 3}, g = {0.3, 0.1, -0.2, 0.05};
  auto out = run(R"(  param %p : f32[4]
  param %g : f32[4]
  param %m : f32[4]
  param %v : f32[4]
  param %lr : f32[]
  param %step : i64[]
  param %skip : bool[]
  %p2 : f32[4], %m2 : f32[4], %v2 : f32[4] = ampc::Adam(%p, %g, %m, %v, %lr, %step, %skip) {lamb = 1, weight_decay = 0.01}
  output %p2)",
                 {{"p", p}, {"g", g}, {"m", {0, 0, 0, 0}}, {"v", {0, 0, 0, 0}}, {"lr", {0.02}}, {"step", {1}}, {"skip", {0}}});
  // Step 1 from zero moments: m^ = g, v^ = g^2, so u = g / (|g| + eps) + wd p.
  std::vector<double> u(4);
  double pn = 0, un = 0;
  for (int i = 0; i < 4; ++i) {
    u[i] = g[i] / (std::fabs(g[i]) + 1e-8) + 0.01 * p[i];
    pn += p[i] * p[i];
    un += u[i] * u[i];
  }
  const double trust = std::sqrt(pn) / std::sqrt(un);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[0].getDouble(i), p[i] - 0.02 * trust * u[i], 1e-5);
}

TEST(TrainOps, LearningRateSchedules) {
  auto lr = [](const std::string& attrs, int64_t step) {
    return run("  param %s : i64[]\n  %lr : f32[] = ampc::LearningRate(%s) {" + attrs + "}\n  output %lr", {{"s", {static_cast<double>(step)}}})[0].getDouble(0);
  };
  EXPECT_FLOAT_EQ(lr("lr = 0.5", 7), 0.5f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear-warmup\", warmup = 10", 5), 0.25f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear-warmup\", warmup = 10", 50), 0.5f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"cosine\", total = 100, warmup = 10", 55), static_cast<float>(0.25 * (1 + std::cos(M_PI * 0.5))));
  EXPECT_NEAR(lr("lr = 0.5, schedule = \"cosine\", total = 100, warmup = 10", 100), 0.0, 1e-7);
  // linear: the warmup, then down to 0 at total, and 0 past it.
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear\", total = 100, warmup = 10", 5), 0.25f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear\", total = 100, warmup = 10", 10), 0.5f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear\", total = 100, warmup = 10", 55), 0.25f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear\", total = 100, warmup = 10", 100), 0.0f);
  EXPECT_FLOAT_EQ(lr("lr = 0.5, schedule = \"linear\", total = 100, warmup = 10", 130), 0.0f);
}
