#include "compiler/ir/bytes.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace ampc {
namespace {

std::shared_ptr<uint8_t> allocateZeroed(size_t n) {
  void* p = std::calloc(n ? n : 1, 1);
  if (!p) throw std::bad_alloc();
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { std::free(q); });
}

struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base) munmap(base, size);
  }
};

}  // namespace

Bytes::Bytes(size_t n) : n_(n), owned_(true), zero_(true) {
  auto s = allocateZeroed(n);
  p_ = s.get();
  keep_ = std::move(s);
}

Bytes Bytes::view(std::shared_ptr<const void> owner, const uint8_t* p, size_t n) {
  Bytes b;
  b.keep_ = std::move(owner);
  b.p_ = const_cast<uint8_t*>(p);  // never written: owned_ is false, so writes copy first
  b.n_ = n;
  return b;
}

Bytes Bytes::mapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": not a regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size) {
    void* p = ::mmap(nullptr, m->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      throw std::runtime_error(path + ": mmap failed: " + std::strerror(e));
    }
    m->base = p;
  }
  ::close(fd);
  const auto* data = static_cast<const uint8_t*>(m->base);
  const size_t size = m->size;
  return view(std::move(m), data, size);
}

Bytes Bytes::slice(size_t offset, size_t n) const {
  if (offset > n_ || n > n_ - offset) throw std::out_of_range("Bytes::slice out of range");
  Bytes b = *this;
  b.p_ = p_ + offset;
  b.n_ = n;
  // A slice of owned storage shares it, so the slice must copy before writing.
  if (b.owned_) b.owned_ = false;
  return b;  // a slice of known zeros is known zeros
}

uint8_t* Bytes::mutableData() {
  zero_ = false;
  if (shared()) {
    auto s = allocateZeroed(n_);
    if (n_) std::memcpy(s.get(), p_, n_);
    p_ = s.get();
    keep_ = std::move(s);
    owned_ = true;
  }
  return p_;
}

bool Bytes::operator==(const Bytes& o) const { return n_ == o.n_ && (p_ == o.p_ || n_ == 0 || std::memcmp(p_, o.p_, n_) == 0); }

}  // namespace ampc
