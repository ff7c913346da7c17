// Wire protocol encoding and total decoders.

#include "service/protocol.h"

#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace monarch::service {
namespace {

// Each message's fields are listed once, in a Fields() function that both
// the writer (encoding) and the reader (decoding) walk, so the two
// directions cannot drift apart.

// Appends fixed-width values, length-prefixed strings and counted lists.
class PayloadWriter {
 public:
  template <typename T>
  PayloadWriter& Put(const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(value));
    return *this;
  }
  PayloadWriter& Flag(bool value) { return Put(static_cast<uint8_t>(value)); }
  template <typename E>
  PayloadWriter& Enum(E value, E /*last*/) { return Put(static_cast<uint32_t>(value)); }
  // Flags packed into one word, the first argument in the lowest bit.
  template <typename... Bools>
  PayloadWriter& Bits(const Bools&... flags) {
    uint32_t word = 0, bit = 1;
    ((word |= flags ? bit : 0, bit <<= 1), ...);
    return Put(word);
  }
  PayloadWriter& String(const std::string& s, size_t /*max*/) {
    Put(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
    return *this;
  }
  template <typename T, typename EachFn>
  PayloadWriter& List(const std::vector<T>& items, size_t /*min_item_bytes*/, EachFn each) {
    Put(static_cast<uint32_t>(items.size()));
    for (const T& item : items) each(*this, item);
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
  PayloadReader& Put(T& value) {
    if (!ok_ || in_.size() < sizeof(T)) {
      ok_ = false;
      return *this;
    }
    std::memcpy(&value, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return *this;
  }
  // A flag is a byte of 0 or 1; anything else is malformed.
  PayloadReader& Flag(bool& value) {
    uint8_t byte = 0;
    Put(byte);
    if (byte > 1) ok_ = false;
    value = byte == 1;
    return *this;
  }
  template <typename E>
  PayloadReader& Enum(E& value, E last) {
    uint32_t word = 0;
    Put(word);
    if (word > static_cast<uint32_t>(last)) ok_ = false;
    value = ok_ ? static_cast<E>(word) : E{};
    return *this;
  }
  // A word with a bit set that no flag owns is malformed.
  template <typename... Bools>
  PayloadReader& Bits(Bools&... flags) {
    uint32_t word = 0, bit = 1;
    Put(word);
    if (word >> sizeof...(flags) != 0) ok_ = false;
    ((flags = (word & bit) != 0, bit <<= 1), ...);
    return *this;
  }
  PayloadReader& String(std::string& s, size_t max) {
    uint32_t n = 0;
    Put(n);
    if (!ok_ || n > max || n > in_.size()) {
      ok_ = false;
      return *this;
    }
    s.assign(in_.data(), n);
    in_.remove_prefix(n);
    return *this;
  }
  // A count of items each at least `min_item_bytes` long: bounded by what
  // is left, so a hostile count cannot make a decoder reserve gigabytes.
  template <typename T, typename EachFn>
  PayloadReader& List(std::vector<T>& items, size_t min_item_bytes, EachFn each) {
    uint32_t n = 0;
    Put(n);
    if (!ok_ || uint64_t{n} * min_item_bytes > in_.size()) {
      ok_ = false;
      return *this;
    }
    items.resize(n);
    for (T& item : items) each(*this, item);
    return *this;
  }
  void Fail() { ok_ = false; }
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

// Checks that only decoding needs (the writer has nothing to check).
void Check(PayloadWriter&, bool) {}
void Check(PayloadReader& r, bool ok) {
  if (!ok) r.Fail();
}


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
      type > static_cast<uint32_t>(MessageType::kProveAccess)) {
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

namespace {

// A list of file ids: its length, then the ids.
template <typename Codec>
void IdFields(Codec& c, std::vector<uint32_t>& ids) {
  c.List(ids, 4, [](Codec& c, auto& id) { c.Put(id); });
}

template <typename Codec>
void Fields(Codec& c, Hello& m) {
  c.Put(m.version).String(m.dataset_root, 4096);
  if (m.version >= 4) c.String(m.dataset_key, 64);
  if (m.version >= 8) c.String(m.job, 256);
}

template <typename Codec>
void JobFields(Codec& c, std::vector<JobStats>& jobs) {
  c.List(jobs, 48, [](Codec& c, auto& job) {
    c.String(job.name, 256).Put(job.processes).Put(job.hits).Put(job.hit_bytes);
    c.Put(job.misses).Put(job.miss_bytes).Put(job.source_bytes);
  });
}

template <typename Codec>
void Fields(Codec& c, HelloReply& m) {
  c.Put(m.instance_id).Put(m.service_pid).Put(m.file_count).Put(m.max_open_files);
  c.Put(m.buffer_bytes).String(m.dataset_root, 4096);
  c.List(m.tiers, 17, [](Codec& c, auto& t) {
    c.Put(t.kind).String(t.name, 4096).String(t.path, 4096).Put(t.descriptors).Flag(t.huge_pages);
  });
  c.String(m.cache_shape, 64 * 1024);
  c.Flag(m.guest);
  Check(c, m.tiers.size() <= 64 && m.TotalDescriptors() <= kMaxDescriptors);
}

template <typename Codec>
void Fields(Codec& c, ReadRequest& m) {
  c.Put(m.file_id).Put(m.offset).Put(m.length);
}

template <typename Codec>
void Fields(Codec& c, ReadReply& m) {
  c.Put(m.bytes);
}

template <typename Codec>
void Fields(Codec& c, ProveAccessRequest& m) {
  c.Put(m.file_id);
}

template <typename Codec>
void Fields(Codec& c, ErrorReply& m) {
  c.Put(m.code).String(m.message, 64 * 1024);
}

template <typename Codec>
void Fields(Codec& c, StatsReply& m) {
  c.List(m.node.metrics, 28, [](Codec& c, auto& metric) {
    c.String(metric.name, 256).Enum(metric.kind, Metric::Kind::kGauge).Put(metric.value);
    c.String(metric.help, 4096).String(metric.tier, 4096).String(metric.tier_kind, 64);
  });
  c.List(m.clients, 40, [](Codec& c, auto& client) {
    c.Put(client.pid).Put(client.connections).Put(client.hits).Put(client.hit_bytes);
    c.Put(client.misses).Put(client.miss_bytes);
  });
  JobFields(c, m.jobs);
}

template <typename Codec>
void Fields(Codec& c, StageRequest& m) {
  c.List(m.globs, 4, [](Codec& c, auto& glob) { c.String(glob, 4096); });
}

template <typename Codec>
void Fields(Codec& c, AnnounceRequest& m) {
  c.Bits(m.first, m.last, m.ranges);
  if (!m.ranges) return IdFields(c, m.file_ids);
  c.List(m.samples, 20, [](Codec& c, auto& sample) {
    c.Put(sample.file_id).Put(sample.offset).Put(sample.length);
  });
}

template <typename Codec>
void Fields(Codec& c, ConsumedNotice& m) {
  IdFields(c, m.file_ids);
}

template <typename Codec>
void Fields(Codec& c, ReadAheadNotice& m) {
  c.Put(m.file_id).Put(m.end);
}

template <typename Codec>
void Fields(Codec& c, CheckedCopiesRequest& m) {
  IdFields(c, m.ids);
  Check(c, m.ids.size() <= kMaxCheckedCopiesPerMessage);  // More than a reply holds.
}

template <typename Codec>
void Fields(Codec& c, CheckedCopiesReply& m) {
  c.List(m.copies, 44, [](Codec& c, auto& stamp) {
    c.Put(stamp.id).Put(stamp.copy.device).Put(stamp.copy.inode).Put(stamp.copy.size);
    c.Put(stamp.copy.mtime_ns).Put(stamp.copy.ctime_ns);
  });
}

template <typename Codec>
void Fields(Codec& c, StageProgress& m) {
  c.Put(m.files_total).Put(m.bytes_total).Put(m.files_done).Put(m.bytes_done);
  c.Put(m.files_in_tiers).Put(m.finished);
}

template <typename Codec>
void Fields(Codec& c, StatusReply& m) {
  c.Put(m.service_pid).Put(m.uptime_seconds).String(m.dataset_root, 4096).Put(m.clients);
  c.Put(m.files).Put(m.dataset_bytes).Put(m.files_in_tiers).Put(m.bytes_in_tiers);
  c.String(m.dataset_key, 64).String(m.cache_shape, 64 * 1024).Put(m.source_bytes);
  JobFields(c, m.jobs);
}

template <typename M>
std::string EncodeFields(const M& m) {
  PayloadWriter w;
  Fields(w, const_cast<M&>(m));  // The writer only reads the fields.
  return w.Take();
}

template <typename M>
absl::StatusOr<M> DecodeFields(absl::string_view payload, absl::string_view what) {
  PayloadReader r(payload);
  M m;
  Fields(r, m);
  if (absl::Status s = r.Finish(what); !s.ok()) return s;
  return m;
}

}  // namespace

std::string Encode(const Hello& m) { return EncodeFields(m); }
std::string Encode(const HelloReply& m) { return EncodeFields(m); }
std::string Encode(const ReadRequest& m) { return EncodeFields(m); }
std::string Encode(const ReadReply& m) { return EncodeFields(m); }
std::string Encode(const ProveAccessRequest& m) { return EncodeFields(m); }
std::string Encode(const ErrorReply& m) { return EncodeFields(m); }
std::string Encode(const StatsReply& m) { return EncodeFields(m); }
std::string Encode(const StageRequest& m) { return EncodeFields(m); }
std::string Encode(const AnnounceRequest& m) { return EncodeFields(m); }
std::string Encode(const ConsumedNotice& m) { return EncodeFields(m); }
std::string Encode(const ReadAheadNotice& m) { return EncodeFields(m); }
std::string Encode(const CheckedCopiesRequest& m) { return EncodeFields(m); }
std::string Encode(const CheckedCopiesReply& m) { return EncodeFields(m); }
std::string Encode(const StageProgress& m) { return EncodeFields(m); }
std::string Encode(const StatusReply& m) { return EncodeFields(m); }
absl::StatusOr<Hello> DecodeHello(absl::string_view p) { return DecodeFields<Hello>(p, "hello"); }
absl::StatusOr<HelloReply> DecodeHelloReply(absl::string_view p) {
  return DecodeFields<HelloReply>(p, "hello reply");
}
absl::StatusOr<ReadRequest> DecodeReadRequest(absl::string_view p) {
  return DecodeFields<ReadRequest>(p, "read");
}
absl::StatusOr<ReadReply> DecodeReadReply(absl::string_view p) {
  return DecodeFields<ReadReply>(p, "read reply");
}
absl::StatusOr<ProveAccessRequest> DecodeProveAccessRequest(absl::string_view p) {
  return DecodeFields<ProveAccessRequest>(p, "prove access");
}
absl::StatusOr<ErrorReply> DecodeErrorReply(absl::string_view p) {
  return DecodeFields<ErrorReply>(p, "error");
}
absl::StatusOr<StatsReply> DecodeStatsReply(absl::string_view p) {
  return DecodeFields<StatsReply>(p, "stats reply");
}
absl::StatusOr<StageRequest> DecodeStageRequest(absl::string_view p) {
  return DecodeFields<StageRequest>(p, "stage");
}
absl::StatusOr<AnnounceRequest> DecodeAnnounceRequest(absl::string_view p) {
  return DecodeFields<AnnounceRequest>(p, "announce");
}
absl::StatusOr<ConsumedNotice> DecodeConsumedNotice(absl::string_view p) {
  return DecodeFields<ConsumedNotice>(p, "consumed");
}
absl::StatusOr<ReadAheadNotice> DecodeReadAheadNotice(absl::string_view p) {
  return DecodeFields<ReadAheadNotice>(p, "read-ahead");
}
absl::StatusOr<CheckedCopiesRequest> DecodeCheckedCopiesRequest(absl::string_view p) {
  return DecodeFields<CheckedCopiesRequest>(p, "checked copies");
}
absl::StatusOr<CheckedCopiesReply> DecodeCheckedCopiesReply(absl::string_view p) {
  return DecodeFields<CheckedCopiesReply>(p, "checked copies reply");
}
absl::StatusOr<StageProgress> DecodeStageProgress(absl::string_view p) {
  return DecodeFields<StageProgress>(p, "stage progress");
}
absl::StatusOr<StatusReply> DecodeStatusReply(absl::string_view p) {
  return DecodeFields<StatusReply>(p, "status reply");
}

}  // namespace monarch::service
