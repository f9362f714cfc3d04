// The deterministic scatter-adds' sort (kernels/cuda/ops.h, OrderBuffers): CUB's radix sort of
// (target, item) pairs, stable, so each target's items stay in item order.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/ops.h"

namespace ampc::cuda {

namespace {
size_t align256(size_t b) { return (b + 255) / 256 * 256; }
size_t cubBytes(int64_t n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                  static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), static_cast<int>(n), 0, 32);
  return bytes;
}
}  // namespace

size_t orderScratch(int64_t items) {
  if (items <= 0 || items >= (int64_t{1} << 31)) return 0;
  return 4 * align256(sizeof(uint32_t) * static_cast<size_t>(items)) + align256(cubBytes(items));
}

OrderBuffers orderBuffers(void* scratch, int64_t items) {
  OrderBuffers b;
  char* p = static_cast<char*>(scratch);
  const size_t arr = align256(sizeof(uint32_t) * static_cast<size_t>(items));
  b.keys = reinterpret_cast<uint32_t*>(p);
  b.items = reinterpret_cast<uint32_t*>(p + arr);
  b.sortedKeys = reinterpret_cast<uint32_t*>(p + 2 * arr);
  b.sortedItems = reinterpret_cast<uint32_t*>(p + 3 * arr);
  b.temp = p + 4 * arr;
  b.tempBytes = cubBytes(items);
  b.n = items;
  return b;
}

cudaError_t sortOrder(const OrderBuffers& b, uint32_t targets, cudaStream_t st) {
  int bits = 1;
  while (bits < 32 && (uint64_t{1} << bits) <= targets) ++bits;  // the sentinel `targets` sorts last
  size_t bytes = b.tempBytes;
  return cub::DeviceRadixSort::SortPairs(b.temp, bytes, b.keys, b.sortedKeys, b.items, b.sortedItems, static_cast<int>(b.n), 0, bits, st);
}

}  // namespace ampc::cuda
