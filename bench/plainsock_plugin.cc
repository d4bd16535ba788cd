// libnccl-net-plainsock.so: the baseline the Meridian plugin is measured against in
// bench/nccl_plugin_bench.sh. The plainest NCCL net plugin that does the job well: one TCP
// socket per connection, no striping, no helper threads, no copies (send and recv straight
// from and into the caller's buffers), progress made inside test() as NCCL's proxy thread
// calls it. Host memory only, one receive per irecv, FIFO per connection. It is a benchmark
// baseline, not a product: no authentication, loopback by default (PLAINSOCK_ADDR=a.b.c.d
// picks the address to listen on).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "nccl_plugin/net_abi.h"

namespace {

MerNcclLogger gLog = nullptr;

struct Header {
  std::uint64_t size;
  std::int32_t tag;
  std::int32_t pad;
};

struct Comm;

struct Request {
  Comm* comm;
  char* data;
  std::size_t size;  // send: bytes to send; recv: capacity until the header says
  int tag;
  Header header{};
  std::size_t headerDone = 0, dataDone = 0;
  bool done = false;
  int error = kNcclSuccess;
};

struct Comm {
  int fd = -1;
  bool sender = false;
  std::deque<Request*> queue;  // in posting order; the front is on the wire
  int inflight = 0;
};

struct ListenComm {
  int fd = -1;
};

int fail(const char* what) {
  if (gLog != nullptr) gLog(kNcclLogWarn, kNcclLogNet, __FILE__, __LINE__, "plainsock: %s: %s", what, std::strerror(errno));
  return kNcclSystemError;
}

int tune(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) return fail("TCP_NODELAY");
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return fail("O_NONBLOCK");
  return kNcclSuccess;
}

// Moves bytes of one buffer until done or the socket would block. Returns -1 on an error or a
// closed peer, else the bytes moved (possibly 0).
long move(Comm* c, char* p, std::size_t n) {
  std::size_t moved = 0;
  while (moved < n) {
    ssize_t r = c->sender ? ::send(c->fd, p + moved, n - moved, MSG_NOSIGNAL) : ::recv(c->fd, p + moved, n - moved, 0);
    if (r > 0) {
      moved += static_cast<std::size_t>(r);
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return -1;
    }
  }
  return static_cast<long>(moved);
}

// Progresses the connection's queue front to back until the socket would block.
int progress(Comm* c) {
  while (!c->queue.empty()) {
    Request* r = c->queue.front();
    if (r->headerDone < sizeof(Header)) {
      if (c->sender && r->headerDone == 0) r->header = Header{r->size, r->tag, 0};
      long n = move(c, reinterpret_cast<char*>(&r->header) + r->headerDone, sizeof(Header) - r->headerDone);
      if (n < 0) return fail(c->sender ? "send" : "recv");
      r->headerDone += static_cast<std::size_t>(n);
      if (r->headerDone < sizeof(Header)) return kNcclSuccess;
      if (!c->sender) {
        if (r->header.size > r->size || r->header.tag != r->tag) {
          if (gLog != nullptr) {
            gLog(kNcclLogWarn, kNcclLogNet, __FILE__, __LINE__, "plainsock: message of %lu bytes, tag %d for a receive of %zu, tag %d",
                 static_cast<unsigned long>(r->header.size), r->header.tag, r->size, r->tag);
          }
          return kNcclInvalidUsage;
        }
        r->size = r->header.size;
      }
    }
    long n = move(c, r->data + r->dataDone, r->size - r->dataDone);
    if (n < 0) return fail(c->sender ? "send" : "recv");
    r->dataDone += static_cast<std::size_t>(n);
    if (r->dataDone < r->size) return kNcclSuccess;
    r->done = true;
    c->queue.pop_front();
  }
  return kNcclSuccess;
}

int init(void** ctx, std::uint64_t, MerNcclNetCommConfig*, MerNcclLogger logger, MerNcclProfilerCallback) {
  gLog = logger;
  *ctx = &gLog;
  return kNcclSuccess;
}

int devices(int* n) {
  *n = 1;
  return kNcclSuccess;
}

int getProperties(int dev, MerNcclProps_v11* props) {
  if (dev != 0) return kNcclInvalidArgument;
  static char name[] = "plainsock";
  static char pci[] = "";
  *props = MerNcclProps_v11{};
  props->name = name;
  props->pciPath = pci;
  props->ptrSupport = kNcclPtrHost;
  props->regIsGlobal = 1;
  props->speed = 10000;
  props->latency = 0;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->netDeviceType = kNcclNetDeviceHost;
  props->vProps.ndevs = 1;
  props->maxP2pBytes = props->maxCollBytes = std::size_t{1} << 31;
  props->maxMultiRequestSize = 1;
  return kNcclSuccess;
}

int listen(void*, int, void* handle, void** listenComm) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const char* addr = std::getenv("PLAINSOCK_ADDR");
  if (::inet_pton(AF_INET, addr != nullptr ? addr : "127.0.0.1", &a.sin_addr) != 1) {
    ::close(fd);
    return kNcclInvalidArgument;
  }
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int rc = fail("bind/listen");
    ::close(fd);
    return rc;
  }
  std::memset(handle, 0, kNcclNetHandleMaxBytes);
  std::memcpy(handle, &a, sizeof a);
  *listenComm = new ListenComm{fd};
  return kNcclSuccess;
}

int connect(void*, int, void* handle, void** sendComm, Dev**) {
  sockaddr_in a{};
  std::memcpy(&a, handle, sizeof a);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail("socket");
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    int rc = fail("connect");
    ::close(fd);
    return rc;
  }
  if (int rc = tune(fd); rc != kNcclSuccess) {
    ::close(fd);
    return rc;
  }
  auto* c = new Comm;
  c->fd = fd;
  c->sender = true;
  *sendComm = c;
  return kNcclSuccess;
}

int accept(void* listenComm, void** recvComm, Dev**) {
  int fd = ::accept4(static_cast<ListenComm*>(listenComm)->fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return fail("accept");
  if (int rc = tune(fd); rc != kNcclSuccess) {
    ::close(fd);
    return rc;
  }
  auto* c = new Comm;
  c->fd = fd;
  *recvComm = c;
  return kNcclSuccess;
}

int regMr(void*, void* data, std::size_t, int type, void** mh) {
  if (type != kNcclPtrHost) return kNcclInvalidArgument;
  *mh = data != nullptr ? data : &gLog;  // nothing to register for host memory over sockets
  return kNcclSuccess;
}

int regMrDmaBuf(void*, void*, std::size_t, int, std::uint64_t, int, void**) { return kNcclInvalidUsage; }

int deregMr(void*, void*) { return kNcclSuccess; }

int post(Comm* c, void* data, std::size_t size, int tag, void** request) {
  if (c->inflight >= kNcclNetMaxRequests) {
    *request = nullptr;  // NCCL retries
    return kNcclSuccess;
  }
  auto* r = new Request{c, static_cast<char*>(data), size, tag};
  c->queue.push_back(r);
  ++c->inflight;
  *request = r;
  return progress(c);
}

int isend(void* comm, void* data, std::size_t size, int tag, void*, void*, void** request) {
  return post(static_cast<Comm*>(comm), data, size, tag, request);
}

int irecv(void* comm, int n, void** data, std::size_t* sizes, int* tags, void**, void**, void** request) {
  if (n != 1) return kNcclInvalidArgument;  // maxRecvs is 1
  return post(static_cast<Comm*>(comm), data[0], sizes[0], tags[0], request);
}

int iflush(void*, int, void**, int*, void**, void** request) {
  *request = nullptr;  // host memory: nothing to flush
  return kNcclSuccess;
}

int test(void* request, int* done, int* size) {
  auto* r = static_cast<Request*>(request);
  if (!r->done) {
    if (int rc = progress(r->comm); rc != kNcclSuccess) return rc;
  }
  *done = r->done ? 1 : 0;
  if (r->done) {
    if (size != nullptr) *size = static_cast<int>(r->size);
    --r->comm->inflight;
    delete r;
  }
  return kNcclSuccess;
}

int closeComm(void* comm) {
  auto* c = static_cast<Comm*>(comm);
  for (Request* r : c->queue) delete r;
  ::close(c->fd);
  delete c;
  return kNcclSuccess;
}

int closeListen(void* listenComm) {
  auto* l = static_cast<ListenComm*>(listenComm);
  ::close(l->fd);
  delete l;
  return kNcclSuccess;
}

int getDeviceMr(void*, void*, void**) { return kNcclInvalidUsage; }
int irecvConsumed(void*, int, void*) { return kNcclSuccess; }
int makeVDevice(int*, MerNcclVDeviceProps*) { return kNcclInvalidUsage; }
int finalize(void*) { return kNcclSuccess; }
int setNetAttr(void*, MerNcclNetAttr*) { return kNcclSuccess; }

}  // namespace

extern "C" __attribute__((visibility("default"))) const MerNcclNet_v11 ncclNetPlugin_v11 = {
    "plainsock", init,    devices,  getProperties, listen,        connect,     accept,   regMr,
    regMrDmaBuf, deregMr, isend,    irecv,         iflush,        test,        closeComm, closeComm,
    closeListen, getDeviceMr, irecvConsumed, makeVDevice, finalize, setNetAttr,
};
