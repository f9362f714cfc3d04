// The bytes of a tensor: owned, or a read-only view into storage that something else keeps alive
// (a memory-mapped weights file, a protobuf string taken over from a parsed model). Copies share
// the storage; the first write through a shared or viewed buffer copies it (copy on write), so a
// tensor's value never changes behind another tensor's back. This is how weights pass from the
// ONNX file through the passes into the plan's weights file and the device once, not three times.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace ampc {

class Bytes {
 public:
  Bytes() = default;
  Bytes(const Bytes&) = default;
  Bytes& operator=(const Bytes&) = default;
  // A moved-from buffer is empty (like a moved-from vector), never a dangling writable pointer.
  Bytes(Bytes&& o) noexcept { swap(o); }
  Bytes& operator=(Bytes&& o) noexcept {
    Bytes(std::move(o)).swap(*this);
    return *this;
  }
  void swap(Bytes& o) noexcept {
    keep_.swap(o.keep_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(owned_, o.owned_);
    std::swap(zero_, o.zero_);
  }
  // n zero bytes. Large buffers come from the allocator's zeroed pages (calloc), which the kernel
  // maps lazily: an optimizer state that is never written costs no resident memory.
  explicit Bytes(size_t n);
  // A read-only view of [p, p + n), kept valid by `owner`.
  static Bytes view(std::shared_ptr<const void> owner, const uint8_t* p, size_t n);
  // The whole file at `path`, mapped read-only (Error-free: throws std::runtime_error with errno text).
  static Bytes mapFile(const std::string& path);
  // Bytes [offset, offset + n) of this buffer, sharing its storage.
  Bytes slice(size_t offset, size_t n) const;

  const uint8_t* data() const { return p_; }
  uint8_t* data() { return mutableData(); }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  uint8_t operator[](size_t i) const { return p_[i]; }
  uint8_t& operator[](size_t i) { return mutableData()[i]; }
  const uint8_t* begin() const { return p_; }
  const uint8_t* end() const { return p_ + n_; }
  uint8_t* begin() { return mutableData(); }
  uint8_t* end() { return mutableData() + n_; }
  // True when this buffer reads storage it does not own alone (a view, or shared by a copy).
  bool shared() const { return !owned_ || keep_.use_count() > 1; }
  // True when the bytes are zeros by construction (Bytes(n), never written): a reader can skip
  // them (a plan stores no optimizer state; a device memsets instead of copying) without paging in
  // memory that was never touched.
  bool knownZero() const { return zero_; }

  bool operator==(const Bytes& o) const;

 private:
  uint8_t* mutableData();

  std::shared_ptr<const void> keep_;  // keeps the storage alive
  uint8_t* p_ = nullptr;
  size_t n_ = 0;
  bool owned_ = false;  // the storage was allocated here (writable once unshared)
  bool zero_ = false;   // zeros by construction, not written since
};

}  // namespace ampc
