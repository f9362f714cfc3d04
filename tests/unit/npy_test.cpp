// .npy reading and writing: every supported dtype round-trips; bad files give clear errors.
#include <gtest/gtest.h>

#include "runtime/npy.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using namespace ampc::test;

TEST(Npy, RoundTripEveryDType) {
  TempDir d;
  std::mt19937 rng(std::random_device{}());
  for (DType t : {DType::f16, DType::f32, DType::f64, DType::i64, DType::i32, DType::i8, DType::u8, DType::boolean}) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, {5}, {2, 3, 4}, {0, 3}}) {
      Tensor x(TensorType{t, shape});
      for (auto& b : x.data) b = static_cast<uint8_t>(rng());
      if (t == DType::boolean) for (auto& b : x.data) b &= 1;
      writeNpy(d.file("a.npy"), x);
      Tensor y = readNpy(d.file("a.npy"));
      EXPECT_EQ(y.type, x.type) << dtypeName(t);
      EXPECT_EQ(y.data, x.data) << dtypeName(t);
      EXPECT_FALSE(std::filesystem::exists(d.file("a.npy.tmp")));
    }
  }
  // bf16 has no NumPy dtype: it is written as f32, exactly.
  Tensor b = Tensor::fromDoubles(DType::bf16, {2}, {1.5, -0.0078125});
  writeNpy(d.file("b.npy"), b);
  Tensor back = readNpy(d.file("b.npy"));
  EXPECT_EQ(back.type.str(), "f32[2]");
  EXPECT_EQ(back.getDouble(1), -0.0078125);
}

TEST(Npy, ReadsWhatNumPyWrites) {
  if (run("/usr/bin/python3 -c 'import numpy'").code != 0) GTEST_SKIP() << "python3-numpy missing";
  TempDir d;
  auto r = run("/usr/bin/python3 -c \"import numpy as np; np.save('" + d.file("n.npy") +
               "', np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5); np.save('" + d.file("f.npy") +
               "', np.asfortranarray(np.ones((2, 3))))\"");
  ASSERT_EQ(r.code, 0) << r.out;
  Tensor t = readNpy(d.file("n.npy"));
  EXPECT_EQ(t.type.str(), "f32[3,4]");
  EXPECT_EQ(t.getDouble(11), 5.5);
  EXPECT_THROW(readNpy(d.file("f.npy")), Error);
  // And NumPy reads what ampc writes.
  writeNpy(d.file("w.npy"), Tensor::fromInts(DType::i64, {2, 2}, {1, -2, 3, 4}));
  r = run("/usr/bin/python3 -c \"import numpy as np; a = np.load('" + d.file("w.npy") + "'); print(a.dtype, a.shape, a.sum())\"");
  EXPECT_NE(r.out.find("int64 (2, 2) 6"), std::string::npos) << r.out;
}

TEST(Npy, BadFilesNameTheFile) {
  TempDir d;
  auto expectError = [&](const std::string& name, const std::string& want) {
    try {
      readNpy(d.file(name));
      FAIL() << name;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(d.file(name)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expectError("missing.npy", "no such file");
  writeBytes(d.file("junk.npy"), "hello world, not numpy");
  expectError("junk.npy", "not a .npy file");
  writeNpy(d.file("ok.npy"), Tensor(TensorType{DType::f32, {100}}));
  std::string bytes = readBytes(d.file("ok.npy"));
  writeBytes(d.file("short.npy"), bytes.substr(0, bytes.size() - 10));
  expectError("short.npy", "truncated");
  std::string c8 = bytes;
  c8.replace(c8.find("<f4"), 3, "<c8");
  writeBytes(d.file("c8.npy"), c8);
  expectError("c8.npy", "unsupported .npy dtype '<c8'");
}
