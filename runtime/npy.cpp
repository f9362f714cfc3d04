#include "runtime/npy.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kernels/cpu/kernel.h"

namespace ampc {
namespace {

struct Descr {
  const char* text;
  DType dtype;
};
constexpr Descr kDescrs[] = {{"<f2", DType::f16}, {"<f4", DType::f32}, {"<f8", DType::f64}, {"<i8", DType::i64},
                             {"<i4", DType::i32}, {"|i1", DType::i8},  {"|u1", DType::u8},  {"|b1", DType::boolean}};

// The value of 'key' in the header dict, as raw text up to the next top-level comma or brace.
std::string field(const std::string& h, const std::string& key, const std::string& path) {
  auto k = h.find("'" + key + "'");
  if (k == std::string::npos) throw Error(path + ": .npy header has no '" + key + "'");
  auto colon = h.find(':', k);
  size_t b = colon + 1, depth = 0, e = b;
  for (; e < h.size(); ++e) {
    char ch = h[e];
    if (ch == '(') ++depth;
    else if (ch == ')') --depth;
    else if ((ch == ',' || ch == '}') && depth == 0) break;
  }
  std::string v = h.substr(b, e - b);
  while (!v.empty() && v.front() == ' ') v.erase(v.begin());
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

Tensor readNpy(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(path + ": no such file");
  std::string bytes(static_cast<size_t>(size), '\0');
  std::ifstream in(path, std::ios::binary);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(size))) throw Error(path + ": could not read the file");
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw Error(path + ": not a .npy file");
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t hlen, off;
  if (major == 1) {
    hlen = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    off = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error(path + ": truncated .npy header");
    hlen = 0;
    for (int i = 0; i < 4; ++i) hlen |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    off = 12;
  } else {
    throw Error(path + ": unsupported .npy version " + std::to_string(major));
  }
  if (bytes.size() < off + hlen) throw Error(path + ": truncated .npy header");
  const std::string h = bytes.substr(off, hlen);
  std::string descr = field(h, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"')) throw Error(path + ": bad descr " + descr);
  descr = descr.substr(1, descr.size() - 2);
  if (descr == "<b1" || descr == "=b1") descr = "|b1";
  if (descr == "<u1") descr = "|u1";
  if (descr == "<i1") descr = "|i1";
  std::optional<DType> dt;
  for (const auto& d : kDescrs)
    if (descr == d.text) dt = d.dtype;
  if (!dt) throw Error(path + ": unsupported .npy dtype '" + descr + "' (use f16, f32, f64, i64, i32, i8, u8 or bool, little-endian)");
  if (field(h, "fortran_order", path) != "False") throw Error(path + ": Fortran-order arrays are not supported; save with np.ascontiguousarray");
  std::string shape = field(h, "shape", path);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')') throw Error(path + ": bad shape " + shape);
  TensorType type{*dt, {}};
  std::string dims = shape.substr(1, shape.size() - 2);
  size_t pos = 0;
  while (pos < dims.size()) {
    size_t comma = dims.find(',', pos);
    std::string d = dims.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    d.erase(0, d.find_first_not_of(' '));
    if (!d.empty()) d.erase(d.find_last_not_of(' ') + 1);
    if (!d.empty()) {
      if (d.size() > 15 || d.find_first_not_of("0123456789") != std::string::npos) throw Error(path + ": bad shape " + shape);
      type.shape.push_back(std::stoll(d));
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  if (!type.sizeFits()) throw Error(path + ": shape " + shape + " is too large");
  const size_t data = off + hlen;
  if (bytes.size() - data < type.bytes())
    throw Error(path + ": truncated: " + type.str() + " needs " + std::to_string(type.bytes()) + " bytes of data, the file has " +
                std::to_string(bytes.size() - data));
  Tensor t(type);
  if (type.bytes()) std::memcpy(t.data.data(), bytes.data() + data, type.bytes());
  return t;
}

void writeNpy(const std::string& path, const Tensor& tensor) {
  const Tensor t = tensor.type.dtype == DType::bf16 ? cpu::castTensor(tensor, DType::f32) : tensor;
  const char* descr = nullptr;
  for (const auto& d : kDescrs)
    if (d.dtype == t.type.dtype) descr = d.text;
  std::string shape = "(";
  for (int64_t d : t.type.shape) shape += std::to_string(d) + ", ";
  if (t.type.shape.size() > 1) shape.resize(shape.size() - 2);
  else if (t.type.shape.size() == 1) shape.resize(shape.size() - 1);
  shape += ")";
  std::string h = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const size_t total = 10 + h.size() + 1;
  h.append((64 - total % 64) % 64, ' ');
  h += '\n';
  std::string header = "\x93NUMPY";
  header += '\x01';
  header += '\x00';
  header += static_cast<char>(h.size() & 0xff);
  header += static_cast<char>(h.size() >> 8);
  header += h;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(path + ": cannot open for writing");
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(t.data.data()), static_cast<std::streamsize>(t.data.size()));
    if (!out.flush()) {
      std::remove(tmp.c_str());
      throw Error(path + ": write failed");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(path + ": rename failed: " + ec.message());
}

}  // namespace ampc
