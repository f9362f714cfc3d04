// The ONNX importer (mapped file, raw-data scan, protobuf parse, shape inference, the verifier),
// then what a plan's compile runs on what it accepts: the fusions, autocast at bf16, cast cleanup
// and autodiff.
#include "compiler/onnx/onnx.h"
#include "passes/autocast.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ampc;
  const std::string path = fuzz::asFile("model.onnx", data, size);
  return fuzz::refusedOrDone([&] {
    auto g = importOnnxFile(path);
    createCsePass()->run(*g);
    createFuseAttentionPass()->run(*g);
    createFuseGeluPass()->run(*g);
    AutocastOptions ao;
    ao.low = DType::bf16;
    createAutocastPass(ao)->run(*g);
    createCastCleanupPass()->run(*g);
    createAutodiffPass()->run(*g);
    verify(*g);
  });
}
