#include "runtime/dist.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

namespace ampc {
namespace {

using Clock = std::chrono::steady_clock;

int64_t envInt(const char* name, int64_t lo, int64_t hi, std::optional<int64_t> dflt) {
  const char* v = std::getenv(name);
  if (!v || !*v) {
    if (dflt) return *dflt;
    throw Error(std::string("the environment sets WORLD_SIZE but not ") + name);
  }
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    throw Error(std::string(name) + "='" + v + "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

// ---- framing over a socket, every wait bounded

bool waitFd(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop = nullptr) {
  for (;;) {
    if (stop && *stop) return false;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool sendAll(int fd, const void* data, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    if (!waitFd(fd, POLLOUT, deadline)) return false;
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool recvAll(int fd, void* data, size_t n, Clock::time_point deadline, const std::atomic<bool>* stop = nullptr) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    if (!waitFd(fd, POLLIN, deadline, stop)) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool sendBlob(int fd, const std::string& s, Clock::time_point deadline) {
  const uint32_t n = htonl(static_cast<uint32_t>(s.size()));
  return sendAll(fd, &n, 4, deadline) && sendAll(fd, s.data(), s.size(), deadline);
}

constexpr uint32_t kMaxBlob = 1u << 20;  // keys and rendezvous addresses are small

bool recvBlob(int fd, std::string& s, Clock::time_point deadline, const std::atomic<bool>* stop = nullptr) {
  uint32_t n = 0;
  if (!recvAll(fd, &n, 4, deadline, stop)) return false;
  n = ntohl(n);
  if (n > kMaxBlob) return false;
  s.assign(n, '\0');
  return recvAll(fd, s.data(), n, deadline, stop);
}

std::string endpoint(const std::string& host, int port) { return host + ":" + std::to_string(port); }

// ---- the rendezvous store: rank 0 serves it, every rank (rank 0 too) is a client

// Requests: 'S' key value -> 1; 'G' key -> value (waits until the key is set); 'W' key -> 1
// (waits). A wait that outlasts the server's timeout answers 0 (for 'G': length 0xffffffff).
class StoreServer {
 public:
  StoreServer(const std::string& host, int port, std::chrono::milliseconds timeout) : timeout_(timeout) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
      throw Error("rank 0: cannot resolve MASTER_ADDR '" + host + "'");
    fd_ = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool ok = fd_ >= 0 && ::bind(fd_, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd_, 1024) == 0;
    const int err = errno;
    ::freeaddrinfo(res);
    if (!ok) {
      if (fd_ >= 0) ::close(fd_);
      throw Error("rank 0: cannot serve the rendezvous store at " + endpoint(host, port) + ": " + std::strerror(err));
    }
    accept_ = std::thread([this] { acceptLoop(); });
  }
  ~StoreServer() {
    stop_ = true;
    cv_.notify_all();
    accept_.join();
    for (auto& t : clients_) t.join();
    ::close(fd_);
  }

 private:
  void acceptLoop() {
    while (!stop_) {
      if (!waitFd(fd_, POLLIN, Clock::now() + std::chrono::milliseconds(200), &stop_)) continue;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) clients_.emplace_back([this, c] { serve(c); });
    }
  }
  void serve(int c) {
    const auto forever = Clock::now() + std::chrono::hours(24 * 365);
    for (;;) {
      char op = 0;
      std::string key;
      if (!recvAll(c, &op, 1, forever, &stop_) || !recvBlob(c, key, forever, &stop_)) break;
      const auto deadline = Clock::now() + timeout_;
      if (op == 'S') {
        std::string value;
        if (!recvBlob(c, value, deadline, &stop_)) break;
        {
          std::lock_guard<std::mutex> l(m_);
          kv_[key] = std::move(value);
        }
        cv_.notify_all();
        const char ack = 1;
        if (!sendAll(c, &ack, 1, deadline)) break;
      } else if (op == 'G' || op == 'W') {
        std::unique_lock<std::mutex> l(m_);
        const bool there = cv_.wait_until(l, deadline, [&] { return stop_ || kv_.count(key); }) && !stop_;
        std::string value = there && op == 'G' ? kv_[key] : std::string();
        l.unlock();
        if (op == 'W') {
          const char ack = there ? 1 : 0;
          if (!sendAll(c, &ack, 1, deadline)) break;
        } else if (!there) {
          const uint32_t none = 0xffffffffu;
          if (!sendAll(c, &none, 4, deadline)) break;
        } else if (!sendBlob(c, value, deadline)) {
          break;
        }
      } else {
        break;
      }
    }
    ::close(c);
  }

  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::vector<std::thread> clients_;
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};

class StoreClient : public gloo::rendezvous::Store {
 public:
  StoreClient(int rank, const std::string& host, int port, std::chrono::milliseconds timeout)
      : rank_(rank), where_(endpoint(host, port)), timeout_(timeout) {
    // Rank 0 may not serve yet: retry until the timeout.
    const auto deadline = Clock::now() + timeout;
    std::string last = "no answer";
    while (fd_ < 0) {
      addrinfo hints{}, *res = nullptr;
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res)
        throw Error("rank " + std::to_string(rank) + ": cannot resolve MASTER_ADDR '" + host + "'");
      const int s = ::socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s >= 0 && ::connect(s, res->ai_addr, res->ai_addrlen) == 0) {
        fd_ = s;
      } else {
        last = std::strerror(errno);
        if (s >= 0) ::close(s);
      }
      ::freeaddrinfo(res);
      if (fd_ >= 0) break;
      if (Clock::now() > deadline)
        throw Error("rank " + std::to_string(rank) + ": no rendezvous store at " + where_ + " after " + seconds() + " (" + last +
                    "); is rank 0 running?");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~StoreClient() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    const auto deadline = Clock::now() + timeout_;
    char ack = 0;
    if (!request('S', key, deadline) || !sendBlob(fd_, std::string(data.begin(), data.end()), deadline) || !recvAll(fd_, &ack, 1, deadline))
      lost("set '" + key + "'");
  }
  std::vector<char> get(const std::string& key) override {
    const auto deadline = Clock::now() + timeout_ + std::chrono::seconds(5);
    uint32_t n = 0;
    if (!request('G', key, deadline) || !recvAll(fd_, &n, 4, deadline)) lost("get '" + key + "'");
    if (n == 0xffffffffu) missing(key);
    n = ntohl(n);
    if (n > kMaxBlob) lost("get '" + key + "'");
    std::vector<char> v(n);
    if (!recvAll(fd_, v.data(), n, deadline)) lost("get '" + key + "'");
    return v;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& k : keys) {
      const auto deadline = Clock::now() + std::max(timeout, timeout_) + std::chrono::seconds(5);
      char ack = 0;
      if (!request('W', k, deadline) || !recvAll(fd_, &ack, 1, deadline)) lost("wait for '" + k + "'");
      if (!ack) missing(k);
    }
  }

 private:
  bool request(char op, const std::string& key, Clock::time_point deadline) { return sendAll(fd_, &op, 1, deadline) && sendBlob(fd_, key, deadline); }
  std::string seconds() const { return std::to_string(timeout_.count() / 1000.0).substr(0, 5) + " s"; }
  [[noreturn]] void lost(const std::string& what) const {
    throw Error("rank " + std::to_string(rank_) + ": the rendezvous store at " + where_ + " stopped answering (" + what + ")");
  }
  [[noreturn]] void missing(const std::string& key) const {
    throw Error("rank " + std::to_string(rank_) + ": rank " + key + " did not join the group within " + seconds() + " (rendezvous at " +
                where_ + ")");
  }

  int rank_;
  std::string where_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
};

bool isLoopback(const std::string& host) { return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0; }

}  // namespace

std::optional<DistEnv> DistEnv::fromEnvironment() {
  if (!std::getenv("WORLD_SIZE")) return std::nullopt;
  DistEnv e;
  e.world = static_cast<int>(envInt("WORLD_SIZE", 1, 1 << 16, std::nullopt));
  e.rank = static_cast<int>(envInt("RANK", 0, e.world - 1, std::nullopt));
  e.localRank = static_cast<int>(envInt("LOCAL_RANK", 0, e.world - 1, int64_t{e.rank}));
  if (e.world == 1) {  // a group of one has no peers to meet: its store is its own, on a free loopback port
    e.storePort = freeLoopbackPort();
    return e;
  }
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.masterAddr = a;
  else throw Error("the environment sets WORLD_SIZE=" + std::to_string(e.world) + " but not MASTER_ADDR");
  const int64_t master = envInt("MASTER_PORT", 1, 65535, std::nullopt);
  const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  const bool agentHoldsPort = agent && (std::string(agent) == "True" || std::string(agent) == "1");
  e.storePort = static_cast<int>(envInt("AMPC_STORE_PORT", 1, 65535, agentHoldsPort ? std::min<int64_t>(master + 1, 65535) : master));
  return e;
}

struct ProcessGroup::Impl {
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<StoreClient> store;
  std::shared_ptr<gloo::rendezvous::Context> ctx;
};

ProcessGroup::ProcessGroup(int rank, int world, std::unique_ptr<Impl> impl) : rank_(rank), world_(world), impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;

std::unique_ptr<ProcessGroup> ProcessGroup::connect(const DistEnv& env, std::chrono::milliseconds timeout) {
  // gloo's TCP pairs write with writev, which raises SIGPIPE when a peer has died; SIGPIPE's default
  // action would kill this rank silently (the launcher would report "killed by signal 13") instead
  // of letting the collective fail with an error that names the rank. Ignoring it turns the write
  // into EPIPE, which gloo reports as an exception.
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>();
  if (env.rank == 0) impl->server = std::make_unique<StoreServer>(env.masterAddr, env.storePort, timeout);
  impl->store = std::make_unique<StoreClient>(env.rank, env.masterAddr, env.storePort, timeout);
  gloo::transport::tcp::attr attr;
  if (isLoopback(env.masterAddr)) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    attr.hostname = host;
  }
  try {
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    impl->ctx = std::make_shared<gloo::rendezvous::Context>(env.rank, env.world);
    impl->ctx->setTimeout(timeout);
    impl->ctx->connectFullMesh(*impl->store, dev);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(env.rank) + ": could not connect the group of " + std::to_string(env.world) + ": " + e.what());
  }
  return std::unique_ptr<ProcessGroup>(new ProcessGroup(env.rank, env.world, std::move(impl)));
}

void ProcessGroup::allReduceSum(float* data, size_t n) {
  gloo::AllreduceOptions o(impl_->ctx);
  o.setOutput(data, n);
  o.setReduceFunction([](void* out, const void* a, const void* b, size_t k) {
    auto* y = static_cast<float*>(out);
    auto *x0 = static_cast<const float*>(a), *x1 = static_cast<const float*>(b);
    for (size_t i = 0; i < k; ++i) y[i] = x0[i] + x1[i];
  });
  try {
    gloo::allreduce(o);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": the gradient all-reduce failed (did another rank die or hang?): " +
                e.what());
  }
}

std::string ProcessGroup::shareFromRankZero(const std::string& key, const std::string& bytes) {
  const std::string k = "share/" + key;
  if (rank_ == 0) impl_->store->set(k, std::vector<char>(bytes.begin(), bytes.end()));
  const std::vector<char> v = impl_->store->get(k);
  return std::string(v.begin(), v.end());
}

void ProcessGroup::barrier() {
  gloo::BarrierOptions o(impl_->ctx);
  try {
    gloo::barrier(o);
  } catch (const std::exception& e) {
    throw Error("rank " + std::to_string(rank_) + " of " + std::to_string(world_) + ": the closing barrier failed: " + e.what());
  }
}

int freeLoopbackPort() {
  const int s = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (s >= 0) ::close(s);
    throw Error("cannot find a free loopback port for the group's rendezvous");
  }
  ::close(s);
  return ntohs(a.sin_port);
}

}  // namespace ampc
