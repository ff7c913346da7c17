// Fuzz target: the node service's wire protocol (src/service/protocol.h) on
// a byte stream as it arrives on the Unix socket: frames (12-byte header,
// then the payload), each payload handed to the decoder for its type, the
// way NodeService::Serve and the client do. The stream stops at the first
// bad frame, as the service then closes the connection.
//
// Both directions are fed: the requests a client sends the service (Hello,
// Read, Stage, and the payload-less ones) and the replies the client
// decodes (HelloReply, ReadReply, StatsReply, StageProgress, StatusReply,
// Error).
//
// Invariants: a decoded header re-encodes to the same 12 bytes and its
// length is within kMaxPayloadBytes; a decoded message re-encodes to the
// payload it came from (StatsReply: to a payload of the same size that
// decodes to the same message, as an unknown metric kind reads as a
// counter); strings, counts and descriptors are within the protocol's
// limits; an Error reply never becomes an OK status; a refusal is
// InvalidArgument with a short message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "service/protocol.h"

namespace monarch::service {
namespace {

constexpr size_t kMaxMessageBytes = 200;

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument, status.ToString());
  FUZZ_CHECK(!status.message().empty() && status.message().size() <= kMaxMessageBytes,
             status.ToString());
}

// Decodes `payload`; on success checks that it re-encodes to it, then
// `check`s the message.
template <typename Decoder, typename Check>
void RoundTrip(absl::string_view payload, Decoder decode, Check check) {
  auto message = decode(payload);
  if (!message.ok()) {
    CheckRefusal(message.status());
    FUZZ_CHECK(absl::StartsWith(message.status().message(), "malformed "),
               message.status().ToString());
    return;
  }
  const std::string encoded = Encode(*message);
  FUZZ_CHECK(encoded == payload,
             absl::StrCat("re-encodes to ", encoded.size(), " bytes that differ from the ",
                          payload.size(), " received"));
  check(*message);
}

void CheckStatsReply(absl::string_view payload) {
  absl::StatusOr<StatsReply> stats = DecodeStatsReply(payload);
  if (!stats.ok()) {
    CheckRefusal(stats.status());
    return;
  }
  const std::string encoded = Encode(*stats);
  FUZZ_CHECK(encoded.size() == payload.size(),
             absl::StrCat(encoded.size(), " bytes re-encoded, ", payload.size(), " received"));
  absl::StatusOr<StatsReply> again = DecodeStatsReply(encoded);
  FUZZ_CHECK(again.ok(), again.status().ToString());
  FUZZ_CHECK(Encode(*again) == encoded, "a canonical stats reply does not round-trip");
  FUZZ_CHECK(stats->node.metrics.size() <= payload.size() / 28 &&
                 stats->clients.size() <= payload.size() / 40,
             "more items than the payload can hold");
  for (const Metric& metric : stats->node.metrics) {
    FUZZ_CHECK(metric.name.size() <= 256 && metric.help.size() <= 4096 &&
                   metric.tier.size() <= 4096 && metric.tier_kind.size() <= 64,
               "a metric string over its limit");
  }
}

void DecodePayload(MessageType type, absl::string_view payload) {
  switch (type) {
    case MessageType::kHello:
      RoundTrip(payload, DecodeHello, [](const Hello& m) {
        FUZZ_CHECK(m.dataset_root.size() <= 4096, absl::StrCat(m.dataset_root.size()));
      });
      break;
    case MessageType::kHelloReply:
      RoundTrip(payload, DecodeHelloReply, [](const HelloReply& m) {
        FUZZ_CHECK(m.tiers.size() <= 64, absl::StrCat(m.tiers.size(), " tiers"));
        FUZZ_CHECK(m.TotalDescriptors() <= kMaxDescriptors,
                   absl::StrCat(m.TotalDescriptors(), " descriptors"));
        uint64_t descriptors = HelloReply::kFixedDescriptors;
        for (const TierDescription& t : m.tiers) {
          FUZZ_CHECK(t.name.size() <= 4096 && t.path.size() <= 4096, "a tier string too long");
          descriptors += t.descriptors;
        }
        FUZZ_CHECK(descriptors == m.TotalDescriptors(), "TotalDescriptors() is not the sum");
        FUZZ_CHECK(m.dataset_root.size() <= 4096, absl::StrCat(m.dataset_root.size()));
      });
      break;
    case MessageType::kRead:
      RoundTrip(payload, DecodeReadRequest, [](const ReadRequest&) {});
      break;
    case MessageType::kReadReply:
      RoundTrip(payload, DecodeReadReply, [](const ReadReply&) {});
      break;
    case MessageType::kProveAccess:
      RoundTrip(payload, DecodeProveAccessRequest, [](const ProveAccessRequest&) {});
      break;
    case MessageType::kStatsReply:
      CheckStatsReply(payload);
      break;
    case MessageType::kStage:
      RoundTrip(payload, DecodeStageRequest, [&payload](const StageRequest& m) {
        FUZZ_CHECK(m.globs.size() <= payload.size() / 4, absl::StrCat(m.globs.size(), " globs"));
        for (const std::string& glob : m.globs) {
          FUZZ_CHECK(glob.size() <= 4096, absl::StrCat(glob.size()));
        }
      });
      break;
    case MessageType::kStageProgress:
      RoundTrip(payload, DecodeStageProgress, [](const StageProgress&) {});
      break;
    case MessageType::kAnnounce:
      RoundTrip(payload, DecodeAnnounceRequest, [&payload](const AnnounceRequest& m) {
        FUZZ_CHECK(m.file_ids.size() <= payload.size() / 4, absl::StrCat(m.file_ids.size()));
      });
      break;
    case MessageType::kConsumed:
      RoundTrip(payload, DecodeConsumedNotice, [&payload](const ConsumedNotice& m) {
        FUZZ_CHECK(m.file_ids.size() <= payload.size() / 4, absl::StrCat(m.file_ids.size()));
      });
      break;
    case MessageType::kReadAhead:
      RoundTrip(payload, DecodeReadAheadNotice, [](const ReadAheadNotice&) {});
      break;
    case MessageType::kCheckedCopies:
      RoundTrip(payload, DecodeCheckedCopiesRequest, [&payload](const CheckedCopiesRequest& m) {
        FUZZ_CHECK(m.ids.size() <= kMaxCheckedCopiesPerMessage, absl::StrCat(m.ids.size()));
        FUZZ_CHECK(m.ids.size() <= payload.size() / 4, absl::StrCat(m.ids.size()));
      });
      break;
    case MessageType::kCheckedCopiesReply:
      RoundTrip(payload, DecodeCheckedCopiesReply, [&payload](const CheckedCopiesReply& m) {
        FUZZ_CHECK(m.copies.size() <= payload.size() / 44, absl::StrCat(m.copies.size()));
      });
      break;
    case MessageType::kStatusReply:
      RoundTrip(payload, DecodeStatusReply, [](const StatusReply& m) {
        FUZZ_CHECK(m.dataset_root.size() <= 4096, absl::StrCat(m.dataset_root.size()));
      });
      break;
    case MessageType::kError:
      RoundTrip(payload, DecodeErrorReply, [](const ErrorReply& m) {
        FUZZ_CHECK(m.message.size() <= 64 * 1024, absl::StrCat(m.message.size()));
        // Whatever the code, an error reply is an error.
        const absl::Status status = m.ToStatus();
        FUZZ_CHECK(!status.ok(), absl::StrCat("code ", m.code, " became OK"));
        FUZZ_CHECK(status.message() == m.message, "the message changed");
      });
      break;
    case MessageType::kStats:
    case MessageType::kStatus:
    case MessageType::kStop:
    case MessageType::kOk:
    case MessageType::kWaitForPlacement:
      break;  // No payload to decode: the service ignores it.
  }
}

}  // namespace
}  // namespace monarch::service

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  using namespace monarch::service;
  absl::string_view stream(reinterpret_cast<const char*>(bytes), size);
  while (stream.size() >= kFrameHeaderBytes) {
    absl::StatusOr<FrameHeader> header = DecodeFrameHeader(stream.data());
    if (!header.ok()) {
      CheckRefusal(header.status());
      return 0;
    }
    FUZZ_CHECK(header->length <= kMaxPayloadBytes, absl::StrCat(header->length));
    char encoded[kFrameHeaderBytes];
    EncodeFrameHeader(header->type, header->length, encoded);
    FUZZ_CHECK(std::memcmp(encoded, stream.data(), kFrameHeaderBytes) == 0,
               "the frame header does not re-encode to the bytes received");
    stream.remove_prefix(kFrameHeaderBytes);
    if (header->length > stream.size()) return 0;  // "message cut short"
    DecodePayload(header->type, stream.substr(0, header->length));
    stream.remove_prefix(header->length);
  }
  return 0;
}
