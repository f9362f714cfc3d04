// safetensors: every dtype round-trips with metadata; a file laid out by hand (as Python's
// safetensors writes it) reads; truncated and malformed files give errors naming the file and the
// tensor; writing is atomic.
#include <gtest/gtest.h>

#include "runtime/safetensors.h"
#include "tests/unit/test_util.h"

using namespace ampc;
using namespace ampc::test;

TEST(Safetensors, RoundTripEveryDType) {
  TempDir d;
  std::mt19937 rng(std::random_device{}());
  Safetensors st;
  for (DType t : kAllDTypes) {
    Tensor x(TensorType{t, {2, 3}});
    for (auto& b : x.data) b = static_cast<uint8_t>(rng());
    if (t == DType::boolean) for (auto& b : x.data) b &= 1;
    st.tensors.emplace("w." + std::string(dtypeName(t)), std::move(x));
  }
  st.tensors.emplace("scalar", Tensor::fromDoubles(DType::f32, {}, {2.5}));
  st.tensors.emplace("empty", Tensor(TensorType{DType::f32, {0, 4}}));
  st.metadata["step"] = "42";
  writeSafetensors(d.file("a.safetensors"), st);
  EXPECT_FALSE(std::filesystem::exists(d.file("a.safetensors.tmp")));
  Safetensors back = readSafetensors(d.file("a.safetensors"));
  EXPECT_EQ(back.metadata, st.metadata);
  ASSERT_EQ(back.tensors.size(), st.tensors.size());
  for (const auto& [name, t] : st.tensors) EXPECT_EQ(back.tensors.at(name), t) << name;
}

TEST(Safetensors, ReadsTheReferenceLayout) {
  // {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} then two floats, as the format's spec.
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"format":"pt"}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(header.size() >> (8 * i));
  bytes += header;
  const float v[2] = {1.5f, -3.0f};
  bytes.append(reinterpret_cast<const char*>(v), 8);
  TempDir d;
  writeBytes(d.file("ref.safetensors"), bytes);
  Safetensors st = readSafetensors(d.file("ref.safetensors"));
  EXPECT_EQ(st.metadata.at("format"), "pt");
  EXPECT_EQ(st.tensors.at("a").type.str(), "f32[2]");
  EXPECT_EQ(st.tensors.at("a").getDouble(1), -3.0);
}

TEST(Safetensors, BadFilesAreRefused) {
  TempDir d;
  Safetensors st;
  st.tensors.emplace("w", Tensor(TensorType{DType::f32, {64}}));
  writeSafetensors(d.file("ok.safetensors"), st);
  const std::string good = readBytes(d.file("ok.safetensors"));
  auto expectError = [&](const std::string& bytes, const std::string& want) {
    writeBytes(d.file("bad.safetensors"), bytes);
    try {
      readSafetensors(d.file("bad.safetensors"));
      FAIL() << "accepted: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(d.file("bad.safetensors")), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  expectError(good.substr(0, good.size() - 4), "tensor 'w': data_offsets [0, 256] run past");
  expectError(good.substr(0, 20), "truncated or not safetensors");
  expectError("abc", "truncated (no header)");
  std::string notJson = good;
  notJson[8] = '!';
  expectError(notJson, "not valid JSON");
  EXPECT_THROW(readSafetensors(d.file("missing.safetensors")), Error);
  // A failed write leaves the previous file intact.
  EXPECT_THROW(writeSafetensors(d.file("no/such/dir/x.safetensors"), st), Error);
  EXPECT_EQ(readBytes(d.file("ok.safetensors")), good);
}
