// Rail: libfabric RDM endpoints (see rail.h).
#include "transport/fabric/rail.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cstring>
#include <map>
#include <optional>
#include <type_traits>

#include "core/knobs.h"
#include "core/log.h"
#include "transport/registration_cache.h"

namespace meridian::transport::fabric {

static_assert(sizeof(fi_context2) == sizeof(RailOp::providerContext), "RailOp must hold an fi_context2");
static_assert(std::is_standard_layout_v<RailOp>, "libfabric's context pointer is the RailOp's address");

namespace {

constexpr std::uint32_t kApiVersion = FI_VERSION(1, 17);
// Every bit a provider may demand: the rail then follows whichever it returns.
constexpr std::uint64_t kStrictestMrMode =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

std::string fiText(int err) { return fi_strerror(err < 0 ? -err : err); }

struct FiDeleter {
  void operator()(fid* f) const {
    if (f != nullptr) {
      if (int rc = fi_close(f); rc != 0) MLOG_WARN(kTransport, "fi_close: {}", fiText(rc));
    }
  }
};
template <typename T>
struct FidPtr {
  T* p = nullptr;
  FidPtr() = default;
  FidPtr(const FidPtr&) = delete;
  FidPtr& operator=(const FidPtr&) = delete;
  ~FidPtr() { reset(); }
  void reset() {
    if (p != nullptr) FiDeleter{}(&p->fid);
    p = nullptr;
  }
  T* get() const { return p; }
  T** out() { return &p; }
};

struct InfoList {
  fi_info* head = nullptr;
  InfoList() = default;
  InfoList(const InfoList&) = delete;
  InfoList& operator=(const InfoList&) = delete;
  ~InfoList() {
    if (head != nullptr) fi_freeinfo(head);
  }
};

// Hints for RDM tagged endpoints, manual progress, the strictest registration mode.
fi_info* makeHints(const std::string& provider, bool tagged, bool manualProgress) {
  fi_info* h = fi_allocinfo();
  if (h == nullptr) return nullptr;
  h->caps = tagged ? (FI_TAGGED | FI_MSG) : 0;
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->ep_attr->type = FI_EP_RDM;
  h->domain_attr->mr_mode = static_cast<int>(kStrictestMrMode);
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  // efa says its progress is automatic and may refuse manual: ask for either then, and
  // progress it by hand all the same.
  h->domain_attr->control_progress = manualProgress ? FI_PROGRESS_MANUAL : FI_PROGRESS_UNSPEC;
  h->domain_attr->data_progress = manualProgress ? FI_PROGRESS_MANUAL : FI_PROGRESS_UNSPEC;
  h->domain_attr->resource_mgmt = FI_RM_ENABLED;
  h->tx_attr->msg_order = FI_ORDER_SAS;
  h->rx_attr->msg_order = FI_ORDER_SAS;
  if (!provider.empty()) h->fabric_attr->prov_name = ::strdup(provider.c_str());
  return h;
}

int getInfo(const std::string& provider, const std::string& node, bool tagged, InfoList* out) {
  int rc = -FI_ENODATA;
  for (bool manual : {true, false}) {
    fi_info* hints = makeHints(provider, tagged, manual);
    if (hints == nullptr) return -FI_ENOMEM;
    const char* n = node.empty() ? nullptr : node.c_str();
    rc = fi_getinfo(kApiVersion, n, n != nullptr ? "0" : nullptr, n != nullptr ? FI_SOURCE | FI_NUMERICHOST : 0,
                    hints, &out->head);
    fi_freeinfo(hints);
    if (rc != -FI_ENODATA) return rc;
  }
  return rc;
}

bool validProviderName(const std::string& p) {
  return !p.empty() && p.size() <= 64 &&
         std::all_of(p.begin(), p.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == ';' || c == '_' || c == '-'; });
}

// "a,b", or "none" (what an error lists as there).
std::string listed(const std::vector<std::string>& items) { return items.empty() ? "none" : joinCommaList(items); }

}  // namespace

std::string RailInfo::mrModeText(std::uint64_t bits) {
  static constexpr std::pair<std::uint64_t, const char*> kNames[] = {
      {FI_MR_LOCAL, "local"},       {FI_MR_RAW, "raw"},         {FI_MR_VIRT_ADDR, "virt_addr"},
      {FI_MR_ALLOCATED, "allocated"}, {FI_MR_PROV_KEY, "prov_key"}, {FI_MR_MMU_NOTIFY, "mmu_notify"},
      {FI_MR_RMA_EVENT, "rma_event"}, {FI_MR_ENDPOINT, "endpoint"}, {FI_MR_HMEM, "hmem"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((bits & bit) != 0) out += (out.empty() ? "" : "|") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

struct Rail::Impl {
  RailInfo info;
  std::uint32_t addrFormat = 0;
  std::size_t nameBytes = 0;  // the fixed length of this provider's names (0: strings)
  FidPtr<fid_fabric> fabric;
  FidPtr<fid_domain> domain;
  FidPtr<fid_av> av;
  FidPtr<fid_cq> cq;
  FidPtr<fid_ep> ep;
  int waitFd = -1;
  std::vector<std::uint8_t> name;
  std::string nameText;
  Status failure;

  struct Registration {
    fid_mr* mr = nullptr;
    void* desc = nullptr;
    std::uint64_t key = 0;
  };
  std::map<std::uint64_t, Registration> registrations;  // by handle
  std::uint64_t nextHandle = 1;
  std::uint64_t nextKey = 1;  // requested keys: unique per domain (1.17 refuses repeats)
  std::optional<RegistrationCache> cache;
  std::vector<std::shared_ptr<void>> retired;  // freed after the endpoint closes

  Result<std::uint64_t> registerRange(std::uintptr_t base, std::size_t bytes) {
    iovec iov{reinterpret_cast<void*>(base), bytes};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = FI_SEND | FI_RECV;
    const std::uint64_t keyMask =
        info.mrKeyBytes >= 8 ? ~std::uint64_t{0} : (std::uint64_t{1} << (8 * info.mrKeyBytes)) - 1;
    attr.requested_key = nextKey++ & keyMask;
    attr.iface = FI_HMEM_SYSTEM;
    Registration r;
    if (int rc = fi_mr_regattr(domain.get(), &attr, 0, &r.mr); rc != 0) {
      return pathError("fabric {}: registering {} bytes at {:#x}: {}", info.provider, bytes, base, fiText(rc));
    }
    if ((info.mrMode & FI_MR_ENDPOINT) != 0) {
      int rc = fi_mr_bind(r.mr, &ep.get()->fid, 0);
      if (rc == 0) rc = fi_mr_enable(r.mr);
      if (rc != 0) {
        FiDeleter{}(&r.mr->fid);
        return pathError("fabric {}: binding a registration to the endpoint: {}", info.provider, fiText(rc));
      }
    }
    r.desc = fi_mr_desc(r.mr);
    r.key = fi_mr_key(r.mr);
    const std::uint64_t handle = nextHandle++;
    registrations[handle] = r;
    return handle;
  }

  void deregister(std::uint64_t handle) {
    auto it = registrations.find(handle);
    if (it == registrations.end()) return;
    FiDeleter{}(&it->second.mr->fid);
    registrations.erase(it);
  }

  // A peer's name as this provider takes it, or why not.
  Status checkName(std::span<const std::uint8_t> n) const {
    if (n.empty() || n.size() > kMaxRailNameBytes) {
      return invalidArgument("a {} address of {} bytes (1 to {} expected)", info.provider, n.size(), kMaxRailNameBytes);
    }
    if (nameBytes != 0 && n.size() != nameBytes) {
      return invalidArgument("a {} address of {} bytes, not {}", info.provider, n.size(), nameBytes);
    }
    switch (addrFormat) {
      case FI_SOCKADDR_IN: {
        sockaddr_in sa{};
        if (n.size() < sizeof(sa)) return invalidArgument("a {} address of {} bytes", info.provider, n.size());
        std::memcpy(&sa, n.data(), sizeof(sa));
        if (sa.sin_family != AF_INET) return invalidArgument("a {} address that is not IPv4", info.provider);
        break;
      }
      case FI_SOCKADDR_IN6: {
        sockaddr_in6 sa{};
        if (n.size() < sizeof(sa)) return invalidArgument("a {} address of {} bytes", info.provider, n.size());
        std::memcpy(&sa, n.data(), sizeof(sa));
        if (sa.sin6_family != AF_INET6) return invalidArgument("a {} address that is not IPv6", info.provider);
        break;
      }
      case FI_ADDR_STR: {
        // "fi_shm://1234:0:0": printable up to one terminating NUL at the end.
        const auto end = std::find(n.begin(), n.end(), std::uint8_t{0});
        if (end == n.end() || end + 1 != n.end() || end == n.begin()) {
          return invalidArgument("a {} address that is not one NUL-terminated string", info.provider);
        }
        if (!std::all_of(n.begin(), end, [](std::uint8_t c) { return c > 0x20 && c < 0x7f; })) {
          return invalidArgument("a {} address with unprintable bytes", info.provider);
        }
        break;
      }
      default:
        break;  // fixed-length binary names (verbs, efa): the length is all one can check
    }
    return Status::ok();
  }

  std::string nameToText(std::span<const std::uint8_t> n) const {
    if (!checkName(n).isOk()) return fmt::format("<{} bytes not a {} address>", n.size(), info.provider);
    char buf[kMaxRailNameBytes + 64] = {};
    std::size_t len = sizeof(buf);
    const char* s = fi_av_straddr(av.get(), n.data(), buf, &len);
    return s != nullptr ? std::string(buf) : "<unprintable>";
  }

  void fail(const Status& why) {
    if (failure.isOk()) {
      MLOG_ERROR(kTransport, "{}", why.message());
      failure = why;
    }
  }

  std::string errorText(const fi_cq_err_entry& e) const {
    std::string text = fiText(e.err);
    if (e.prov_errno != 0) {
      char buf[256] = {};
      const char* p = fi_cq_strerror(cq.get(), e.prov_errno, e.err_data, buf, sizeof(buf));
      if (p != nullptr && *p != '\0' && text != p) text += fmt::format(" ({})", p);
    }
    if (e.olen > 0) text += fmt::format("; {} bytes did not fit", e.olen);
    return text;
  }
};

std::vector<std::string> Rail::providers() {
  InfoList list;
  std::vector<std::string> out;
  if (getInfo("", "", true, &list) != 0) return out;
  for (fi_info* i = list.head; i != nullptr; i = i->next) {
    std::string p = i->fabric_attr->prov_name != nullptr ? i->fabric_attr->prov_name : "";
    if (!p.empty() && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

Result<std::unique_ptr<Rail>> Rail::open(const RailOptions& options) {
  if (!validProviderName(options.provider)) {
    return invalidArgument("fabric provider '{}' is not a provider name (e.g. tcp;ofi_rxm, shm, verbs;ofi_rxm, efa)",
                           options.provider);
  }
  InfoList list;
  int rc = getInfo(options.provider, options.sourceAddress, true, &list);
  if (rc == -FI_ENODATA) {
    InfoList any;
    if (getInfo(options.provider, "", false, &any) == 0) {
      if (!options.sourceAddress.empty() && getInfo(options.provider, "", true, &any) == 0) {
        return invalidArgument("fabric provider '{}' cannot listen on {}", options.provider, options.sourceAddress);
      }
      return invalidArgument("fabric provider '{}' offers no tagged messages on reliable endpoints (FI_TAGGED, FI_EP_RDM)",
                             options.provider);
    }
    return invalidArgument("libfabric has no provider '{}' here (it has: {})", options.provider, listed(providers()));
  }
  if (rc != 0) return pathError("fi_getinfo for fabric provider '{}': {}", options.provider, fiText(rc));

  // Providers list every interface (tcp: each address family of each, duplicates too) and
  // ignore domain hints: choose here. IPv4 before IPv6; link-local IPv6 never.
  fi_info* chosen = nullptr;
  std::vector<std::string> domains;
  for (int pass = 0; pass < 2 && chosen == nullptr; ++pass) {
    for (fi_info* i = list.head; i != nullptr; i = i->next) {
      const std::string dom = i->domain_attr->name != nullptr ? i->domain_attr->name : "";
      if (pass == 0 && std::find(domains.begin(), domains.end(), dom) == domains.end()) domains.push_back(dom);
      if (!options.domain.empty() && dom != options.domain) continue;
      if (pass == 0 && i->addr_format == FI_SOCKADDR_IN6) continue;
      if (i->addr_format == FI_SOCKADDR_IN6 && i->src_addr != nullptr) {
        const auto* sa = static_cast<const sockaddr_in6*>(i->src_addr);
        if (IN6_IS_ADDR_LINKLOCAL(&sa->sin6_addr)) continue;
      }
      chosen = i;
      break;
    }
  }
  if (chosen == nullptr) {
    return invalidArgument("fabric provider '{}' has no domain '{}' here (it has: {})", options.provider,
                           options.domain, listed(domains));
  }

  auto impl = std::make_unique<Impl>();
  RailInfo& info = impl->info;
  info.provider = chosen->fabric_attr->prov_name != nullptr ? chosen->fabric_attr->prov_name : options.provider;
  info.domain = chosen->domain_attr->name != nullptr ? chosen->domain_attr->name : "";
  info.fabric = chosen->fabric_attr->name != nullptr ? chosen->fabric_attr->name : "";
  info.mrMode = static_cast<std::uint64_t>(chosen->domain_attr->mr_mode);
  info.mrKeyBytes = chosen->domain_attr->mr_key_size;
  info.injectBytes = chosen->tx_attr->inject_size;
  info.maxMessageBytes = chosen->ep_attr->max_msg_size;
  info.iovLimit = chosen->tx_attr->iov_limit;
  info.txDepth = chosen->tx_attr->size;
  info.rxDepth = chosen->rx_attr->size;
  const std::uint64_t tagFormat = chosen->ep_attr->mem_tag_format;
  info.tagBits = tagFormat == 0 ? 64 : 64 - std::countl_zero(tagFormat);
  if (info.tagBits < kMinTagBits) {
    return invalidArgument("fabric provider '{}' gives {} tag bits; Meridian needs {}", info.provider, info.tagBits,
                           kMinTagBits);
  }
  impl->addrFormat = chosen->addr_format;

  if (int r = fi_fabric(chosen->fabric_attr, impl->fabric.out(), nullptr); r != 0) {
    return pathError("fabric {}: fi_fabric: {}", info.provider, fiText(r));
  }
  if (int r = fi_domain(impl->fabric.get(), chosen, impl->domain.out(), nullptr); r != 0) {
    return pathError("fabric {} on {}: fi_domain: {}", info.provider, info.domain, fiText(r));
  }
  fi_av_attr avAttr{};
  avAttr.type = FI_AV_TABLE;
  if (int r = fi_av_open(impl->domain.get(), &avAttr, impl->av.out(), nullptr); r != 0) {
    return pathError("fabric {}: fi_av_open: {}", info.provider, fiText(r));
  }
  // Room for every operation's completion, errors included (an overrun queue is fatal).
  fi_cq_attr cqAttr{};
  cqAttr.format = FI_CQ_FORMAT_TAGGED;
  cqAttr.size = std::max<std::size_t>(info.txDepth + info.rxDepth, 256);
  cqAttr.wait_obj = FI_WAIT_FD;
  if (fi_cq_open(impl->domain.get(), &cqAttr, impl->cq.out(), nullptr) == 0) {
    if (fi_control(&impl->cq.get()->fid, FI_GETWAIT, &impl->waitFd) != 0) impl->waitFd = -1;
  } else {
    // shm and efa have no fd to sleep on: such rails are polled.
    cqAttr.wait_obj = FI_WAIT_NONE;
    if (int r = fi_cq_open(impl->domain.get(), &cqAttr, impl->cq.out(), nullptr); r != 0) {
      return pathError("fabric {}: fi_cq_open: {}", info.provider, fiText(r));
    }
  }
  info.waitFd = impl->waitFd >= 0;
  if (int r = fi_endpoint(impl->domain.get(), chosen, impl->ep.out(), nullptr); r != 0) {
    return pathError("fabric {}: fi_endpoint: {}", info.provider, fiText(r));
  }
  if (int r = fi_ep_bind(impl->ep.get(), &impl->cq.get()->fid, FI_TRANSMIT | FI_RECV); r != 0) {
    return pathError("fabric {}: binding the completion queue: {}", info.provider, fiText(r));
  }
  if (int r = fi_ep_bind(impl->ep.get(), &impl->av.get()->fid, 0); r != 0) {
    return pathError("fabric {}: binding the address vector: {}", info.provider, fiText(r));
  }
  if (int r = fi_enable(impl->ep.get()); r != 0) {
    return pathError("fabric {}: enabling the endpoint: {}", info.provider, fiText(r));
  }
  std::size_t len = kMaxRailNameBytes;
  impl->name.resize(len);
  if (int r = fi_getname(&impl->ep.get()->fid, impl->name.data(), &len); r != 0) {
    return pathError("fabric {}: fi_getname: {}", info.provider, fiText(r));
  }
  impl->name.resize(len);
  impl->nameBytes = impl->addrFormat == FI_ADDR_STR ? 0 : len;
  impl->nameText = impl->nameToText(impl->name);
  Impl* raw = impl.get();
  impl->cache.emplace([raw](std::uintptr_t base, std::size_t bytes) { return raw->registerRange(base, bytes); },
                      [raw](std::uint64_t handle) { raw->deregister(handle); });
  return std::unique_ptr<Rail>(new Rail(std::move(impl)));
}

Rail::Rail(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Rail::~Rail() {
  // The endpoint first (nothing completes after it), then its registrations, then the rest.
  impl_->ep.reset();
  impl_->cache.reset();
  impl_->retired.clear();
  impl_->cq.reset();
  impl_->av.reset();
  impl_->domain.reset();
  impl_->fabric.reset();
}

const RailInfo& Rail::info() const { return impl_->info; }
const std::vector<std::uint8_t>& Rail::name() const { return impl_->name; }
std::string Rail::describeName(std::span<const std::uint8_t> name) const { return impl_->nameToText(name); }

std::string Rail::describe() const {
  const RailInfo& i = impl_->info;
  return fmt::format("{} on {} at {} (mr_mode {}, inject {} B, {})", i.provider, i.domain, impl_->nameText,
                     RailInfo::mrModeText(i.mrMode), i.injectBytes, i.waitFd ? "sleeps on an fd" : "polled");
}

Result<RailPeer> Rail::addPeer(std::span<const std::uint8_t> name) {
  MERIDIAN_RETURN_IF_ERROR(impl_->checkName(name));
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(impl_->av.get(), name.data(), 1, &addr, 0, nullptr);
  if (n != 1 || addr == FI_ADDR_NOTAVAIL) {
    return invalidArgument("fabric {}: the address {} was not taken: {}", impl_->info.provider,
                           impl_->nameToText(name), n < 0 ? fiText(n) : "refused");
  }
  return static_cast<RailPeer>(addr);
}

Status Rail::removePeer(RailPeer peer) {
  fi_addr_t addr = peer;
  if (int r = fi_av_remove(impl_->av.get(), &addr, 1, 0); r != 0) {
    return invalidArgument("fabric {}: removing peer {}: {}", impl_->info.provider, peer, fiText(r));
  }
  return Status::ok();
}

Result<RailMemory> Rail::registerMemory(const void* base, std::size_t bytes) {
  MERIDIAN_ASSIGN_OR_RETURN(const RegistrationCache::Entry e, impl_->cache->acquire(base, bytes));
  const Impl::Registration& r = impl_->registrations.at(e.key);
  return RailMemory{r.desc, r.key, e.key};
}

Status Rail::releaseMemory(std::uint64_t handle) { return impl_->cache->release(handle); }

std::optional<RailMemory> Rail::registeredMemory(const void* base, std::size_t bytes) const {
  const RegistrationCache::Entry* e = impl_->cache->covering(base, bytes);
  if (e == nullptr) return std::nullopt;
  const Impl::Registration& r = impl_->registrations.at(e->key);
  return RailMemory{r.desc, r.key, e->key};
}
std::uint64_t Rail::registrations() const { return impl_->cache->registrations(); }

Status Rail::postSend(RailPeer peer, std::uint64_t tag, std::span<const iovec> iov, std::span<void* const> desc,
                      RailOp& op) {
  if (iov.empty() || iov.size() != desc.size() || iov.size() > impl_->info.iovLimit) {
    return invalidArgument("fabric send of {} pieces with {} descriptors (the provider takes 1 to {})", iov.size(),
                           desc.size(), impl_->info.iovLimit);
  }
  ssize_t r = fi_tsendv(impl_->ep.get(), iov.data(), const_cast<void**>(desc.data()), iov.size(), peer, tag,
                        op.providerContext);
  if (r == 0) return Status::ok();
  if (r == -FI_EAGAIN) return againStatus("fabric send queue full");
  return pathError("fabric {} send: {}", impl_->info.provider, fiText(static_cast<int>(r)));
}

Status Rail::postRecv(std::uint64_t tag, std::uint64_t ignore, void* buffer, std::size_t bytes, void* desc,
                      RailOp& op) {
  ssize_t r = fi_trecv(impl_->ep.get(), buffer, bytes, desc, FI_ADDR_UNSPEC, tag, ignore, op.providerContext);
  if (r == 0) return Status::ok();
  if (r == -FI_EAGAIN) return againStatus("fabric receive queue full");
  return pathError("fabric {} receive: {}", impl_->info.provider, fiText(static_cast<int>(r)));
}

Status Rail::cancel(RailOp& op) {
  ssize_t r = fi_cancel(&impl_->ep.get()->fid, op.providerContext);
  if (r == 0 || r == -FI_ENOENT) return Status::ok();
  return pathError("fabric {} cancel: {}", impl_->info.provider, fiText(static_cast<int>(r)));
}

std::size_t Rail::progress(std::size_t maxCompletions) {
  constexpr std::size_t kBatch = 16;
  fi_cq_tagged_entry entries[kBatch];
  std::size_t done = 0;
  while (done < maxCompletions) {
    const ssize_t n = fi_cq_read(impl_->cq.get(), entries, std::min(kBatch, maxCompletions - done));
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        auto* op = static_cast<RailOp*>(entries[i].op_context);
        if (op == nullptr || op->handler == nullptr) continue;
        RailCompletion c;
        c.bytes = entries[i].len;
        c.tag = entries[i].tag;
        op->handler->onComplete(*op, c);
      }
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n == -FI_EAGAIN) break;
    if (n != -FI_EAVAIL) {
      impl_->fail(pathError("fabric {}: reading completions: {}", impl_->info.provider, fiText(static_cast<int>(n))));
      break;
    }
    fi_cq_err_entry e{};
    const ssize_t r = fi_cq_readerr(impl_->cq.get(), &e, 0);
    if (r == -FI_EAGAIN) break;
    if (r < 0) {
      impl_->fail(pathError("fabric {}: reading an error completion: {}", impl_->info.provider, fiText(static_cast<int>(r))));
      break;
    }
    ++done;
    const std::string text = impl_->errorText(e);
    auto* op = static_cast<RailOp*>(e.op_context);
    if (op == nullptr) {
      // An error of the endpoint itself (rxm reports some with no operation).
      impl_->fail(pathError("fabric {} on {}: {}", impl_->info.provider, impl_->info.domain, text));
      continue;
    }
    if (op->handler == nullptr) continue;
    RailCompletion c;
    c.canceled = e.err == FI_ECANCELED;
    c.status = c.canceled ? againStatus("fabric operation canceled")
                          : pathError("fabric {} {} failed: {}", impl_->info.provider,
                                      (e.flags & FI_RECV) != 0 ? "receive" : "send", text);
    c.bytes = e.len;
    c.tag = e.tag;
    op->handler->onComplete(*op, c);
  }
  return done;
}

void Rail::retire(std::shared_ptr<void> memory) { impl_->retired.push_back(std::move(memory)); }

const Status& Rail::failure() const { return impl_->failure; }
int Rail::waitFd() const { return impl_->waitFd; }

bool Rail::readyToSleep() {
  if (impl_->waitFd < 0) return false;
  fid* fids[1] = {&impl_->cq.get()->fid};
  return fi_trywait(impl_->fabric.get(), fids, 1) == FI_SUCCESS;
}

}  // namespace meridian::transport::fabric
