#include "runtime/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "runtime/hash.h"

namespace ampc {
namespace {

struct Code {
  DType dtype;
  const char* name;
};
constexpr Code kCodes[] = {{DType::f64, "F64"}, {DType::f32, "F32"}, {DType::f16, "F16"}, {DType::bf16, "BF16"}, {DType::i64, "I64"},
                           {DType::i32, "I32"}, {DType::i8, "I8"},   {DType::u8, "U8"},   {DType::boolean, "BOOL"}};

// write(2) all of `n` bytes, or false.
bool writeAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = ::write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string hex64(uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

}  // namespace

std::string tensorHash(const Tensor& t) { return hex64(hash64(t.data.data(), t.data.size())); }

void writeSafetensors(const std::string& path, const Safetensors& st) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : st.tensors) {
    const char* code = nullptr;
    for (const auto& c : kCodes)
      if (c.dtype == t.type.dtype) code = c.name;
    h[name] = {{"dtype", code}, {"shape", t.type.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::map<std::string, std::string> meta = st.metadata;
  nlohmann::json hashes = nlohmann::json::object();
  for (const auto& [name, t] : st.tensors) hashes[name] = tensorHash(t);
  meta[kHashKey] = hashes.dump();
  h["__metadata__"] = meta;
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t hlen = header.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hlen >> (8 * i));

  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(path + ": cannot open for writing: " + std::strerror(errno));
  bool ok = writeAll(fd, len, 8) && writeAll(fd, header.data(), header.size());
  for (const auto& [name, t] : st.tensors) ok = ok && writeAll(fd, t.data.data(), t.data.size());
  ok = ok && ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw Error(path + ": write failed: " + why);
  }
  // Make the rename itself durable.
  const std::string dir = std::filesystem::path(path).parent_path().empty() ? "." : std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Safetensors readSafetensors(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(path + ": no such file");
  if (size < 8) throw Error(path + ": truncated (no header)");
  // Mapped, not read: each tensor is a view of the file, paged in when it is used.
  Bytes file;
  try {
    file = Bytes::mapFile(path);
  } catch (const std::exception& e) {
    throw Error(std::string(e.what()));
  }
  if (file.size() != size) throw Error(path + ": changed while it was read");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(file[i]) << (8 * i);
  if (hlen > size - 8) throw Error(path + ": truncated or not safetensors (header of " + std::to_string(hlen) + " bytes)");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(file.begin() + 8, file.begin() + 8 + hlen);
  } catch (const std::exception& e) {
    throw Error(path + ": the header is not valid JSON: " + e.what());
  }
  if (!h.is_object()) throw Error(path + ": the header is not a JSON object");
  const uint64_t dataSize = size - 8 - hlen;
  const uint64_t data = 8 + hlen;
  Safetensors st;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) throw Error(path + ": __metadata__ must be an object");
      for (const auto& [k, m] : v.items()) {
        if (!m.is_string()) throw Error(path + ": __metadata__ values must be strings");
        st.metadata[k] = m.get<std::string>();
      }
      continue;
    }
    const std::string what = path + ": tensor '" + name + "'";
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      throw Error(what + " needs dtype, shape and data_offsets");
    std::optional<DType> dt;
    for (const auto& c : kCodes)
      if (v["dtype"] == c.name) dt = c.dtype;
    if (!dt) throw Error(what + " has dtype " + v["dtype"].dump() + ", which ampc does not support");
    TensorType type{*dt, {}};
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) throw Error(what + " has a bad shape");
      type.shape.push_back(d.get<int64_t>());
    }
    if (!type.sizeFits()) throw Error(what + " is too large");
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(what + " has bad data_offsets");
    const uint64_t b = off[0], e = off[1];
    if (b > e || e > dataSize) throw Error(what + ": data_offsets [" + std::to_string(b) + ", " + std::to_string(e) + "] run past the " +
                                           std::to_string(dataSize) + " data bytes (truncated file?)");
    if (e - b != type.bytes()) throw Error(what + ": " + type.str() + " needs " + std::to_string(type.bytes()) + " bytes, the offsets give " + std::to_string(e - b));
    Tensor t;
    t.type = type;
    t.data = file.slice(data + b, e - b);
    st.tensors.emplace(name, std::move(t));
  }
  // Written by ampc: every tensor's hash is checked, so a flipped byte is refused, not trained on.
  if (auto it = st.metadata.find(kHashKey); it != st.metadata.end()) {
    nlohmann::json hashes;
    try {
      hashes = nlohmann::json::parse(it->second);
    } catch (const std::exception&) {
      throw Error(path + ": the tensor hashes (" + std::string(kHashKey) + ") are not valid JSON");
    }
    if (!hashes.is_object()) throw Error(path + ": the tensor hashes (" + std::string(kHashKey) + ") are not a JSON object");
    for (const auto& [name, t] : st.tensors) {
      if (!hashes.contains(name) || !hashes[name].is_string()) throw Error(path + ": tensor '" + name + "' has no hash");
      if (hashes[name].get<std::string>() != tensorHash(t))
        throw Error(path + ": tensor '" + name + "' is corrupt (its xxh3 hash does not match the one written with it)");
    }
    if (hashes.size() != st.tensors.size()) throw Error(path + ": the hashes name tensors that the file does not hold");
    st.metadata.erase(it);
  }
  return st;
}

}  // namespace ampc
