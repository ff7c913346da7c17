// Wire protocol encoding and total decoders.

#include "service/protocol.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace monarch::service {
namespace {

// Appends fixed-width values and length-prefixed strings.
class PayloadWriter {
 public:
  template <typename T>
  PayloadWriter& Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(value));
    return *this;
  }
  PayloadWriter& PutString(absl::string_view s) {
    Put(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
    return *this;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads them back; every read checks the bytes left, and the first failure
// sticks, so decoders check once at the end.
class PayloadReader {
 public:
  explicit PayloadReader(absl::string_view in) : in_(in) {}
  template <typename T>
  T Get() {
    T value{};
    if (!ok_ || in_.size() < sizeof(T)) {
      ok_ = false;
      return value;
    }
    std::memcpy(&value, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return value;
  }
  std::string GetString(size_t max = kMaxStringBytes) {
    const uint32_t n = Get<uint32_t>();
    if (!ok_ || n > max || n > in_.size()) {
      ok_ = false;
      return {};
    }
    std::string s(in_.data(), n);
    in_.remove_prefix(n);
    return s;
  }
  // A count of items each at least `min_item_bytes` long: bounded by what
  // is left, so a hostile count cannot make a decoder reserve gigabytes.
  uint32_t GetCount(size_t min_item_bytes) {
    const uint32_t n = Get<uint32_t>();
    if (ok_ && uint64_t{n} * min_item_bytes > in_.size()) ok_ = false;
    return ok_ ? n : 0;
  }
  absl::Status Finish(absl::string_view what) const {
    if (!ok_) return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " message"));
    if (!in_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("malformed ", what, " message: ", in_.size(), " trailing bytes"));
    }
    return absl::OkStatus();
  }

 private:
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace

void EncodeFrameHeader(MessageType type, uint32_t length, char out[kFrameHeaderBytes]) {
  const uint32_t magic = kFrameMagic;
  const uint32_t type_word = static_cast<uint16_t>(type);
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &type_word, 4);
  std::memcpy(out + 8, &length, 4);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(const char in[kFrameHeaderBytes]) {
  uint32_t magic, type, length;
  std::memcpy(&magic, in, 4);
  std::memcpy(&type, in + 4, 4);
  std::memcpy(&length, in + 8, 4);
  if (magic != kFrameMagic) return absl::InvalidArgumentError("not a Monarch service frame");
  if (type < static_cast<uint32_t>(MessageType::kHello) ||
      type > static_cast<uint32_t>(MessageType::kCheckedCopiesReply)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown message type ", type));
  }
  if (length > kMaxPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat("message of ", length, " bytes is too large"));
  }
  return FrameHeader{static_cast<MessageType>(type), length};
}

uint32_t HelloReply::TotalDescriptors() const {
  uint64_t n = kFixedDescriptors;
  for (const TierDescription& t : tiers) n += t.descriptors;
  return n > kMaxDescriptors ? kMaxDescriptors + 1 : static_cast<uint32_t>(n);
}

absl::Status ErrorReply::ToStatus() const {
  const auto status_code = code == 0 || code > 16 ? absl::StatusCode::kInternal
                                                  : static_cast<absl::StatusCode>(code);
  return absl::Status(status_code, message);
}

ErrorReply ErrorReply::From(const absl::Status& status) {
  return ErrorReply{static_cast<uint32_t>(status.code()), std::string(status.message())};
}

std::string Encode(const Hello& m) {
  PayloadWriter w;
  w.Put(m.version).PutString(m.dataset_root);
  if (m.version >= 4) w.PutString(m.dataset_key);
  return w.Take();
}

absl::StatusOr<Hello> DecodeHello(absl::string_view payload) {
  PayloadReader r(payload);
  Hello m;
  m.version = r.Get<uint32_t>();
  m.dataset_root = r.GetString(4096);
  if (m.version >= 4) m.dataset_key = r.GetString(64);
  if (absl::Status s = r.Finish("hello"); !s.ok()) return s;
  return m;
}

std::string Encode(const HelloReply& m) {
  PayloadWriter w;
  w.Put(m.instance_id).Put(m.service_pid).Put(m.file_count).Put(m.max_open_files).Put(m.buffer_bytes);
  w.PutString(m.dataset_root).Put(static_cast<uint32_t>(m.tiers.size()));
  for (const TierDescription& t : m.tiers) {
    w.Put(t.kind).PutString(t.name).PutString(t.path).Put(t.descriptors).Put(
        static_cast<uint8_t>(t.huge_pages));
  }
  return w.Take();
}

absl::StatusOr<HelloReply> DecodeHelloReply(absl::string_view payload) {
  PayloadReader r(payload);
  HelloReply m;
  m.instance_id = r.Get<uint64_t>();
  m.service_pid = r.Get<uint32_t>();
  m.file_count = r.Get<uint32_t>();
  m.max_open_files = r.Get<uint32_t>();
  m.buffer_bytes = r.Get<uint64_t>();
  m.dataset_root = r.GetString(4096);
  const uint32_t tiers = r.GetCount(16);
  if (tiers > 64) return absl::InvalidArgumentError("malformed hello reply: too many tiers");
  for (uint32_t i = 0; i < tiers; ++i) {
    TierDescription t;
    t.kind = r.Get<uint32_t>();
    t.name = r.GetString(4096);
    t.path = r.GetString(4096);
    t.descriptors = r.Get<uint32_t>();
    const uint8_t huge_pages = r.Get<uint8_t>();
    if (huge_pages > 1) {
      return absl::InvalidArgumentError("malformed hello reply: huge_pages neither 0 nor 1");
    }
    t.huge_pages = huge_pages == 1;
    m.tiers.push_back(std::move(t));
  }
  if (absl::Status s = r.Finish("hello reply"); !s.ok()) return s;
  if (m.TotalDescriptors() > kMaxDescriptors) {
    return absl::InvalidArgumentError("malformed hello reply: too many descriptors");
  }
  return m;
}

std::string Encode(const ReadRequest& m) {
  return PayloadWriter().Put(m.file_id).Put(m.offset).Put(m.length).Take();
}

absl::StatusOr<ReadRequest> DecodeReadRequest(absl::string_view payload) {
  PayloadReader r(payload);
  ReadRequest m;
  m.file_id = r.Get<uint32_t>();
  m.offset = r.Get<uint64_t>();
  m.length = r.Get<uint64_t>();
  if (absl::Status s = r.Finish("read"); !s.ok()) return s;
  return m;
}

std::string Encode(const ReadReply& m) { return PayloadWriter().Put(m.bytes).Take(); }

absl::StatusOr<ReadReply> DecodeReadReply(absl::string_view payload) {
  PayloadReader r(payload);
  ReadReply m;
  m.bytes = r.Get<uint64_t>();
  if (absl::Status s = r.Finish("read reply"); !s.ok()) return s;
  return m;
}

std::string Encode(const ErrorReply& m) {
  return PayloadWriter().Put(m.code).PutString(m.message).Take();
}

absl::StatusOr<ErrorReply> DecodeErrorReply(absl::string_view payload) {
  PayloadReader r(payload);
  ErrorReply m;
  m.code = r.Get<uint32_t>();
  m.message = r.GetString(64 * 1024);
  if (absl::Status s = r.Finish("error"); !s.ok()) return s;
  return m;
}

std::string Encode(const StatsReply& m) {
  PayloadWriter w;
  w.Put(static_cast<uint32_t>(m.node.metrics.size()));
  for (const Metric& metric : m.node.metrics) {
    w.PutString(metric.name).Put(static_cast<uint32_t>(metric.kind)).Put(metric.value);
    w.PutString(metric.help).PutString(metric.tier).PutString(metric.tier_kind);
  }
  w.Put(static_cast<uint32_t>(m.clients.size()));
  for (const ClientStats& c : m.clients) {
    w.Put(c.pid).Put(c.connections).Put(c.hits).Put(c.hit_bytes).Put(c.misses).Put(c.miss_bytes);
  }
  return w.Take();
}

absl::StatusOr<StatsReply> DecodeStatsReply(absl::string_view payload) {
  PayloadReader r(payload);
  StatsReply m;
  const uint32_t metrics = r.GetCount(28);
  for (uint32_t i = 0; i < metrics; ++i) {
    Metric metric;
    metric.name = r.GetString(256);
    const uint32_t kind = r.Get<uint32_t>();
    metric.kind = kind == 1 ? Metric::Kind::kGauge : Metric::Kind::kCounter;
    metric.value = r.Get<uint64_t>();
    metric.help = r.GetString(4096);
    metric.tier = r.GetString(4096);
    metric.tier_kind = r.GetString(64);
    m.node.metrics.push_back(std::move(metric));
  }
  const uint32_t clients = r.GetCount(40);
  for (uint32_t i = 0; i < clients; ++i) {
    ClientStats c;
    c.pid = r.Get<uint32_t>();
    c.connections = r.Get<uint32_t>();
    c.hits = r.Get<uint64_t>();
    c.hit_bytes = r.Get<uint64_t>();
    c.misses = r.Get<uint64_t>();
    c.miss_bytes = r.Get<uint64_t>();
    m.clients.push_back(c);
  }
  if (absl::Status s = r.Finish("stats reply"); !s.ok()) return s;
  return m;
}

std::string Encode(const StageRequest& m) {
  PayloadWriter w;
  w.Put(static_cast<uint32_t>(m.globs.size()));
  for (const std::string& glob : m.globs) w.PutString(glob);
  return w.Take();
}

absl::StatusOr<StageRequest> DecodeStageRequest(absl::string_view payload) {
  PayloadReader r(payload);
  StageRequest m;
  const uint32_t globs = r.GetCount(4);
  for (uint32_t i = 0; i < globs; ++i) m.globs.push_back(r.GetString(4096));
  if (absl::Status s = r.Finish("stage"); !s.ok()) return s;
  return m;
}

namespace {

// A list of file ids: its length, then the ids.
void PutIds(PayloadWriter& w, const std::vector<uint32_t>& ids) {
  w.Put(static_cast<uint32_t>(ids.size()));
  for (uint32_t id : ids) w.Put(id);
}
std::vector<uint32_t> GetIds(PayloadReader& r) {
  const uint32_t count = r.GetCount(4);
  std::vector<uint32_t> ids;
  ids.reserve(count);
  for (uint32_t i = 0; i < count; ++i) ids.push_back(r.Get<uint32_t>());
  return ids;
}

}  // namespace

std::string Encode(const AnnounceRequest& m) {
  PayloadWriter w;
  w.Put(static_cast<uint32_t>((m.first ? 1u : 0u) | (m.last ? 2u : 0u) | (m.ranges ? 4u : 0u)));
  if (!m.ranges) {
    PutIds(w, m.file_ids);
    return w.Take();
  }
  w.Put(static_cast<uint32_t>(m.samples.size()));
  for (const FileRange& sample : m.samples) {
    w.Put(sample.file_id).Put(sample.offset).Put(sample.length);
  }
  return w.Take();
}

absl::StatusOr<AnnounceRequest> DecodeAnnounceRequest(absl::string_view payload) {
  PayloadReader r(payload);
  AnnounceRequest m;
  const uint32_t flags = r.Get<uint32_t>();
  if (flags > 7) return absl::InvalidArgumentError("malformed announce message: unknown flags");
  m.first = (flags & 1) != 0;
  m.last = (flags & 2) != 0;
  m.ranges = (flags & 4) != 0;
  if (!m.ranges) {
    m.file_ids = GetIds(r);
  } else {
    const uint32_t count = r.GetCount(20);
    m.samples.resize(count);
    for (FileRange& sample : m.samples) {
      sample.file_id = r.Get<uint32_t>();
      sample.offset = r.Get<uint64_t>();
      sample.length = r.Get<uint64_t>();
    }
  }
  if (absl::Status s = r.Finish("announce"); !s.ok()) return s;
  return m;
}

std::string Encode(const ConsumedNotice& m) {
  PayloadWriter w;
  PutIds(w, m.file_ids);
  return w.Take();
}

absl::StatusOr<ConsumedNotice> DecodeConsumedNotice(absl::string_view payload) {
  PayloadReader r(payload);
  ConsumedNotice m;
  m.file_ids = GetIds(r);
  if (absl::Status s = r.Finish("consumed"); !s.ok()) return s;
  return m;
}

std::string Encode(const ReadAheadNotice& m) {
  return PayloadWriter().Put(m.file_id).Put(m.end).Take();
}

absl::StatusOr<ReadAheadNotice> DecodeReadAheadNotice(absl::string_view payload) {
  PayloadReader r(payload);
  ReadAheadNotice m;
  m.file_id = r.Get<uint32_t>();
  m.end = r.Get<uint64_t>();
  if (absl::Status s = r.Finish("read-ahead"); !s.ok()) return s;
  return m;
}

std::string Encode(const CheckedCopiesRequest& m) {
  PayloadWriter w;
  PutIds(w, m.ids);
  return w.Take();
}

absl::StatusOr<CheckedCopiesRequest> DecodeCheckedCopiesRequest(absl::string_view payload) {
  PayloadReader r(payload);
  CheckedCopiesRequest m;
  m.ids = GetIds(r);
  if (absl::Status s = r.Finish("checked copies"); !s.ok()) return s;
  if (m.ids.size() > kMaxCheckedCopiesPerMessage) {
    return absl::InvalidArgumentError(
        "malformed checked copies message: more ids than a reply holds");
  }
  return m;
}

std::string Encode(const CheckedCopiesReply& m) {
  PayloadWriter w;
  w.Put(static_cast<uint32_t>(m.copies.size()));
  for (const CheckedCopyStamp& c : m.copies) {
    w.Put(c.id).Put(c.copy.device).Put(c.copy.inode).Put(c.copy.size).Put(c.copy.mtime_ns);
    w.Put(c.copy.ctime_ns);
  }
  return w.Take();
}

absl::StatusOr<CheckedCopiesReply> DecodeCheckedCopiesReply(absl::string_view payload) {
  PayloadReader r(payload);
  CheckedCopiesReply m;
  const uint32_t n = r.GetCount(44);
  m.copies.resize(n);
  for (CheckedCopyStamp& c : m.copies) {
    c.id = r.Get<uint32_t>();
    c.copy.device = r.Get<uint64_t>();
    c.copy.inode = r.Get<uint64_t>();
    c.copy.size = r.Get<uint64_t>();
    c.copy.mtime_ns = r.Get<int64_t>();
    c.copy.ctime_ns = r.Get<int64_t>();
  }
  if (absl::Status s = r.Finish("checked copies reply"); !s.ok()) return s;
  return m;
}

std::string Encode(const StageProgress& m) {
  return PayloadWriter()
      .Put(m.files_total).Put(m.bytes_total).Put(m.files_done).Put(m.bytes_done)
      .Put(m.files_in_tiers).Put(m.finished).Take();
}

absl::StatusOr<StageProgress> DecodeStageProgress(absl::string_view payload) {
  PayloadReader r(payload);
  StageProgress m;
  m.files_total = r.Get<uint64_t>();
  m.bytes_total = r.Get<uint64_t>();
  m.files_done = r.Get<uint64_t>();
  m.bytes_done = r.Get<uint64_t>();
  m.files_in_tiers = r.Get<uint64_t>();
  m.finished = r.Get<uint32_t>();
  if (absl::Status s = r.Finish("stage progress"); !s.ok()) return s;
  return m;
}

std::string Encode(const StatusReply& m) {
  return PayloadWriter()
      .Put(m.service_pid).Put(m.uptime_seconds).PutString(m.dataset_root).Put(m.clients)
      .Put(m.files).Put(m.dataset_bytes).Put(m.files_in_tiers).Put(m.bytes_in_tiers)
      .PutString(m.dataset_key).Take();
}

absl::StatusOr<StatusReply> DecodeStatusReply(absl::string_view payload) {
  PayloadReader r(payload);
  StatusReply m;
  m.service_pid = r.Get<uint32_t>();
  m.uptime_seconds = r.Get<double>();
  m.dataset_root = r.GetString(4096);
  m.clients = r.Get<uint32_t>();
  m.files = r.Get<uint64_t>();
  m.dataset_bytes = r.Get<uint64_t>();
  m.files_in_tiers = r.Get<uint64_t>();
  m.bytes_in_tiers = r.Get<uint64_t>();
  m.dataset_key = r.GetString(64);
  if (absl::Status s = r.Finish("status reply"); !s.ok()) return s;
  return m;
}

}  // namespace monarch::service
