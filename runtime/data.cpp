#include "runtime/data.h"

#include <cmath>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "runtime/npy.h"

namespace fs = std::filesystem;

namespace ampc {

namespace {

// `t` converted in place to `to` where that keeps what it means: a float type to another (rounded
// to nearest), an integer type to another where every value fits. Returns the note; Error otherwise.
std::string convertSamples(Tensor& t, DType to, const std::string& path, const std::string& input) {
  const std::string from(dtypeName(t.type.dtype)), want(dtypeName(to));
  const std::string head = path + ": dtype " + from + ", graph input '" + input + "' wants " + want;
  Tensor r(TensorType{to, t.type.shape});
  if (isFloat(t.type.dtype) && isFloat(to)) {
    for (int64_t i = 0; i < t.numel(); ++i) r.setDouble(i, t.getDouble(i));
  } else if (isInteger(t.type.dtype) && isInteger(to)) {
    const int64_t lo = to == DType::i64 ? INT64_MIN : to == DType::i32 ? INT32_MIN : to == DType::i8 ? INT8_MIN : 0;
    const int64_t hi = to == DType::i64 ? INT64_MAX : to == DType::i32 ? INT32_MAX : to == DType::i8 ? INT8_MAX : UINT8_MAX;
    for (int64_t i = 0; i < t.numel(); ++i) {
      const int64_t v = t.getInt(i);
      if (v < lo || v > hi)
        throw Error(head + ", and element " + std::to_string(i) + " (" + std::to_string(v) + ") does not fit in " + want + "; convert the file");
      r.setInt(i, v);
    }
  } else {
    throw Error(head + "; convert the file (e.g. numpy's x.astype(np." + (to == DType::f32 ? std::string("float32") : to == DType::i64 ? "int64" : want) +
                ")): ampc converts only between float types and between integer types");
  }
  t = std::move(r);
  return path + ": " + from + " samples read as " + want + (isFloat(to) ? " (rounded to nearest)" : "") + " for graph input '" + input + "'";
}

}  // namespace

DataSource DataSource::fromDir(const std::string& dir, const std::vector<const Value*>& inputs, bool shuffle, uint64_t seed) {
  DataSource d;
  d.inputs_ = inputs;
  d.shuffle_ = shuffle;
  d.seed_ = seed;
  if (!fs::is_directory(dir)) throw Error(dir + ": no such data folder");
  for (const Value* v : inputs) {
    const std::string path = (fs::path(dir) / (v->name() + ".npy")).string();
    if (!fs::exists(path)) throw Error(path + ": missing: graph input '" + v->name() + "' (" + v->type().str() + ") is read from it");
    Tensor t = readNpy(path);
    const auto& want = v->type();
    if (want.rank() == 0) throw Error(path + ": graph input '" + v->name() + "' is a scalar; it has no sample dimension");
    if (t.type.dtype != want.dtype) d.notes_.push_back(convertSamples(t, want.dtype, path, v->name()));
    if (t.type.rank() != want.rank() || !std::equal(want.shape.begin() + 1, want.shape.end(), t.type.shape.begin() + 1))
      throw Error(path + ": samples of shape " + t.type.str() + " do not match graph input '" + v->name() + "' " + want.str() +
                  " (the trailing dimensions must agree)");
    const int64_t n = t.type.shape[0];
    d.batch_ = want.shape[0];
    if (n < d.batch_) throw Error(path + ": " + std::to_string(n) + " samples, fewer than one batch of " + std::to_string(d.batch_));
    if (d.samples_ && n != d.samples_)
      throw Error(path + ": " + std::to_string(n) + " samples, but the other inputs have " + std::to_string(d.samples_));
    d.samples_ = n;
    d.data_.emplace(v->name(), std::move(t));
  }
  return d;
}

DataSource DataSource::synthetic(const std::vector<const Value*>& inputs, uint64_t seed, std::map<std::string, std::pair<int64_t, int64_t>> ranges) {
  DataSource d;
  d.inputs_ = inputs;
  d.seed_ = seed;
  d.synthetic_ = true;
  d.intRanges_ = std::move(ranges);
  for (const auto& [name, r] : d.intRanges_) {
    const std::string& n = name;  // (clang before 16 cannot capture a structured binding)
    if (std::none_of(inputs.begin(), inputs.end(), [&](const Value* v) { return v->name() == n; }))
      throw Error("--int-range names '" + name + "', which is not a graph input");
    if (r.first > r.second) throw Error("--int-range " + name + ": LO > HI");
  }
  return d;
}

const std::vector<int64_t>& DataSource::order(int64_t epoch) {
  if (epoch == cachedEpoch_) return order_;
  order_.resize(static_cast<size_t>(samples_));
  std::iota(order_.begin(), order_.end(), 0);
  if (shuffle_) {  // a fixed function of (seed, epoch), so a resumed run sees the same order
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[static_cast<size_t>(rng() % i)]);
  }
  cachedEpoch_ = epoch;
  return order_;
}

void DataSource::shard(int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) throw Error("rank " + std::to_string(rank) + " is outside a group of " + std::to_string(world));
  if (!synthetic_ && samples_ < batch_ * world)
    throw Error(std::to_string(samples_) + " samples, fewer than one global batch of " + std::to_string(batch_ * world) + " (" +
                std::to_string(world) + " processes x " + std::to_string(batch_) + ")");
  rank_ = rank;
  world_ = world;
}

std::map<std::string, Tensor> DataSource::next() {
  std::map<std::string, Tensor> b;
  if (synthetic_) {
    // The global batch is drawn whole (as one process with its batch would draw it) and this
    // replica keeps its rows.
    std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(pos_.index));
    for (const Value* v : inputs_) {
      TensorType global = v->type();
      if (global.rank() > 0) global.shape[0] *= world_;
      Tensor t(global);
      auto r = intRanges_.count(v->name()) ? intRanges_.at(v->name()) : std::pair<int64_t, int64_t>{0, 1};
      std::normal_distribution<double> nd;
      std::uniform_int_distribution<int64_t> ud(r.first, r.second);
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (isFloat(t.type.dtype)) t.setDouble(i, nd(rng));
        else t.setInt(i, ud(rng));
      }
      if (world_ > 1 && global.rank() > 0) {
        Tensor mine(v->type());
        const size_t bytes = mine.data.size();
        if (bytes) std::memcpy(mine.data.data(), t.data.data() + static_cast<size_t>(rank_) * bytes, bytes);
        t = std::move(mine);
      }
      b.emplace(v->name(), std::move(t));
    }
    ++pos_.index;
    return b;
  }
  const int64_t global = batch_ * world_;
  if (pos_.index + global > samples_) {
    ++pos_.epoch;
    pos_.index = 0;
  }
  const auto& o = order(pos_.epoch);
  const int64_t first = pos_.index + rank_ * batch_;
  for (const Value* v : inputs_) {
    const Tensor& src = data_.at(v->name());
    Tensor t(v->type());
    const size_t row = t.data.size() / static_cast<size_t>(batch_);
    for (int64_t i = 0; i < batch_; ++i)
      if (row) std::memcpy(t.data.data() + i * row, src.data.data() + o[first + i] * row, row);
    b.emplace(v->name(), std::move(t));
  }
  pos_.index += global;
  return b;
}

std::string DataSource::firstNonFinite() const {
  for (const Value* v : inputs_) {
    auto it = data_.find(v->name());
    if (it == data_.end() || !isFloat(it->second.type.dtype)) continue;
    const Tensor& t = it->second;
    const int64_t n = t.numel(), row = samples_ ? n / samples_ : 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = t.getDouble(i);
      if (!std::isfinite(x))
        return "input '" + v->name() + "' sample " + std::to_string(row ? i / row : 0) + " (element " + std::to_string(row ? i % row : i) +
               ": " + (std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf") + ")";
    }
  }
  return {};
}

void DataSource::setPosition(Position p) {
  const int64_t maxEpoch = int64_t{1} << 40;
  if (p.epoch < 0 || p.epoch > maxEpoch || p.index < 0 || (!synthetic_ && p.index > samples_))
    throw Error("data position epoch " + std::to_string(p.epoch) + ", index " + std::to_string(p.index) + " is outside the data (" +
                std::to_string(samples_) + " samples)");
  pos_ = p;
}

std::map<std::string, Tensor> DataSource::batchAt(int64_t start) const {
  std::map<std::string, Tensor> b;
  for (const Value* v : inputs_) {
    const Tensor& src = data_.at(v->name());
    Tensor t(v->type());
    const size_t row = t.data.size() / static_cast<size_t>(batch_);
    for (int64_t i = 0; i < batch_; ++i)
      if (row) std::memcpy(t.data.data() + i * row, src.data.data() + ((start + i) % samples_) * row, row);
    b.emplace(v->name(), std::move(t));
  }
  return b;
}

}  // namespace ampc
