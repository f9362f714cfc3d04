// Training data for amprun: one NAME.npy per graph input (leading dimension = samples), cut into
// batches of the graph's batch size, in order or shuffled per epoch; or seeded synthetic data.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "compiler/ir/ir.h"

namespace ampc {

class DataSource {
 public:
  struct Position {
    int64_t epoch = 0, index = 0;  // next sample within the epoch's order
  };
  // Checks every file before the first step: missing, wrong dtype, wrong trailing shape, too few
  // samples, or a sample count that differs between inputs are one Error naming the file. A file
  // of another float type than its input's is rounded to it (numpy's default f64 read as f32, as
  // torch.from_numpy(x).float() does), one of another integer type converted where every value
  // fits (i32 labels as i64), each with a note (notes()); integers for floats, floats for integers
  // and bools for anything else are refused.
  static DataSource fromDir(const std::string& dir, const std::vector<const Value*>& inputs, bool shuffle, uint64_t seed);
  // Seeded random batches: floats N(0, 1), integers uniform in [lo, hi] (default 0..1).
  static DataSource synthetic(const std::vector<const Value*>& inputs, uint64_t seed, std::map<std::string, std::pair<int64_t, int64_t>> intRanges);

  // Data parallel: this process is replica `rank` of `world`. A global batch is `world` batches:
  // replica r takes its r-th batch, so the group reads the samples a single process would read with
  // a batch `world` times as large, in the same order. The position counts global samples. Error
  // (naming no file: the caller's) if the data holds less than one global batch.
  void shard(int rank, int world);
  std::map<std::string, Tensor> next();
  // Samples [start, start + batch) in file order, wrapping around past the end (for evaluation
  // of a last, partial batch).
  std::map<std::string, Tensor> batchAt(int64_t start) const;
  int64_t batchSize() const { return batch_; }
  Position position() const { return pos_; }
  // Error if p cannot be a position of this data (a checkpoint's metadata is not trusted).
  void setPosition(Position p);
  int64_t samples() const { return samples_; }
  // What fromDir converted, one line per file ("PATH: f64 samples read as f32 ...").
  const std::vector<std::string>& notes() const { return notes_; }
  // --check-data: the first sample holding a NaN or Inf, as "input 'x' sample 17 (element 3: nan)";
  // empty when every float input is finite (and for synthetic data).
  std::string firstNonFinite() const;
  int64_t batchesPerEpoch() const { return synthetic_ ? 0 : samples_ / (batch_ * world_); }

 private:
  std::vector<std::string> notes_;
  const std::vector<int64_t>& order(int64_t epoch);  // the epoch's sample order, cached
  std::vector<const Value*> inputs_;
  std::map<std::string, Tensor> data_;
  int64_t batch_ = 1, samples_ = 0;
  int64_t rank_ = 0, world_ = 1;
  bool shuffle_ = false, synthetic_ = false;
  uint64_t seed_ = 0;
  std::map<std::string, std::pair<int64_t, int64_t>> intRanges_;
  Position pos_;
  int64_t cachedEpoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace ampc
