// Golden tests: tests/golden/NAME.ir is IR text whose first line is `# PASSES: p1,p2`; the graph
// after those passes must print exactly as NAME.expected.ir. AMPC_UPDATE_GOLDEN=1 rewrites the
// expected files (review the diff before committing).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "compiler/ir/text.h"
#include "passes/autocast.h"
#include "passes/pass.h"

using namespace ampc;
namespace fs = std::filesystem;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST(Golden, AllCases) {
  fs::path dir = fs::path(AMPC_SOURCE_DIR) / "tests" / "golden";
  int cases = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (e.path().extension() != ".ir" || name.find(".expected.") != std::string::npos) continue;
    SCOPED_TRACE(name);
    std::string text = slurp(e.path());
    const std::string tag = "# PASSES:";
    ASSERT_EQ(text.rfind(tag, 0), 0u) << "first line must be '# PASSES: ...'";
    std::string pipeline = text.substr(tag.size(), text.find('\n') - tag.size());
    auto g = parseGraph(text, name);
    verify(*g, /*checkTypes=*/false);  // inputs may be unfolded: a Reshape target not yet constant
    // An optional `# AMP-CONFIG: {json}` line configures the autocast pass of the pipeline.
    const std::string cfgTag = "\n# AMP-CONFIG:";
    std::string config;
    if (auto at = text.find(cfgTag); at != std::string::npos) {
      auto b = at + cfgTag.size();
      config = text.substr(b, text.find('\n', b) - b);
    }
    PassManager pm;
    std::stringstream names(pipeline);
    for (std::string p; std::getline(names, p, ',');) {
      p.erase(0, p.find_first_not_of(' '));
      p.erase(p.find_last_not_of(' ') + 1);
      if (p == "autocast" && !config.empty()) pm.add(createAutocastPass(parseAmpConfig(config, name)));
      else pm.addPipeline(p);
    }
    pm.run(*g);
    std::string got = printGraph(*g);
    fs::path expectedPath = dir / (e.path().stem().string() + ".expected.ir");
    if (std::getenv("AMPC_UPDATE_GOLDEN")) std::ofstream(expectedPath) << got;
    ASSERT_TRUE(fs::exists(expectedPath)) << "missing " << expectedPath;
    EXPECT_EQ(got, slurp(expectedPath));
    // The output is itself stable text.
    EXPECT_EQ(printGraph(*parseGraph(got)), got);
    ++cases;
  }
  EXPECT_GE(cases, 20);
}
