// Splice: the byte pump of a relay, the third node that carries a relay path's streams
// between two ranks (TcpDevice::openRelay). It moves bytes both ways between two
// non-blocking sockets through bounded buffers, passes each end of stream on (shutting
// the other side's write half) once every byte before it is through, and says which
// readiness it waits for. The bytes are opaque to it: the two ranks authenticate each
// other end to end through it, and frames are checked where they land.
//
// Progress thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/fd.h"

namespace meridian::transport::tcp {

class Splice {
 public:
  // `b` may still be connecting (startConnect); pump() finds out when it is done.
  Splice(UniqueFd a, UniqueFd b, std::size_t bufferBytes);

  enum class State { kRunning, kDone, kFailed };
  // Moves what it can without blocking (at most `budgetBytes` per direction).
  State pump(std::size_t budgetBytes = std::size_t{4} << 20);

  // epoll events to wait for on each socket (EPOLLIN/EPOLLOUT).
  std::uint32_t interestA() const { return connecting_ ? 0 : interest(ab_, ba_); }
  std::uint32_t interestB() const;
  int fdA() const { return a_.get(); }
  int fdB() const { return b_.get(); }
  std::uint64_t bytesForwarded() const { return ab_.moved + ba_.moved; }
  // Why it failed (kFailed).
  const std::string& error() const { return error_; }

 private:
  struct Direction {
    int from = -1;
    int to = -1;
    std::unique_ptr<std::uint8_t[]> buf;
    std::size_t cap = 0, head = 0, tail = 0;
    bool eof = false;       // `from` ended
    bool shutDown = false;  // ... and `to` was told
    std::uint64_t moved = 0;
  };
  // false on a socket error (error_ says which).
  bool move(Direction& d, std::size_t budget);
  static std::uint32_t interest(const Direction& readFromMe, const Direction& writeToMe);

  UniqueFd a_, b_;
  bool connecting_ = true;
  Direction ab_, ba_;
  std::string error_;
};

}  // namespace meridian::transport::tcp
