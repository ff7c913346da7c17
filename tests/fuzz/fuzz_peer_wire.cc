// Fuzz target: the peer protocol's decoders (src/remote/peer_network.h,
// peer_wire::*), on the header and data a hostile or broken peer could send
// in a UCX active message.
//
// Input layout (so that seeds can be written by hand, see write_seeds.cc):
//   byte 0      which message: 0 request, 1 reply, 2 goodbye (mod 3)
//   byte 1      this process's rank
//   byte 2      the job's size (number of ranks)
//   byte 3      the header's length
//   bytes 4..7  reply: the length the request asked for (uint32, host order)
//   then        the header (its length, or what is left), then the data
//
// Invariants: an accepted header re-encodes to the bytes received and comes
// from another rank of the job; a request's FileRequest carries its fields
// unchanged and its name is the data; a request carries the job secret
// (kFuzzSecret, the one write_seeds.cc puts in) exactly when its 32 bytes
// are that secret's, and never for a secret of another length; a reply is accepted only with status
// OK, this protocol and exactly the length asked for, and its data then
// copies into a buffer of that length with the checksum the requester
// compares; every refusal is a bounded message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "fuzz_check.h"
#include "common/crc32c.h"
#include "remote/peer_network.h"

namespace monarch {
namespace {

constexpr size_t kPrefixBytes = 8;
constexpr size_t kMaxMessageBytes = 200;
// The home's job secret in this harness (write_seeds.cc's requests carry it).
constexpr char kFuzzSecret[] = "monarch fuzz job secret 32 bytes";
static_assert(sizeof(kFuzzSecret) - 1 == peer_wire::kSecretBytes, "a 32-byte secret");

void CheckRefusal(const absl::Status& status) {
  FUZZ_CHECK(!status.ok(), "no error");
  FUZZ_CHECK(status.message().size() <= kMaxMessageBytes, status.ToString());
}

void FuzzRequest(absl::string_view header, absl::string_view data, int my_rank, int size) {
  absl::StatusOr<peer_wire::RequestHeader> request =
      peer_wire::DecodeRequestHeader(header, my_rank, size);
  if (!request.ok()) {
    FUZZ_CHECK(request.status().code() == absl::StatusCode::kInvalidArgument,
               request.status().ToString());
    CheckRefusal(request.status());
    return;
  }
  FUZZ_CHECK(header.size() == sizeof(peer_wire::RequestHeader), absl::StrCat(header.size()));
  FUZZ_CHECK(std::memcmp(&*request, header.data(), header.size()) == 0,
             "does not re-encode to the bytes received");
  FUZZ_CHECK(request->protocol == peer_wire::kProtocol, absl::StrCat(request->protocol));
  FUZZ_CHECK(
      request->from_rank >= 0 && request->from_rank < size && request->from_rank != my_rank,
      absl::StrCat("from rank ", request->from_rank, " in a job of ", size, " as rank ", my_rank));
  const PeerNetwork::FileRequest file = peer_wire::ToFileRequest(*request, data);
  FUZZ_CHECK(file.name.data() == data.data() && file.name.size() == data.size(), "name");
  FUZZ_CHECK(file.size == request->file_size && file.mtime_ns == request->file_mtime_ns &&
                 file.offset == request->offset && file.length == request->length,
             "FileRequest fields differ from the header's");
  const absl::string_view secret(kFuzzSecret, peer_wire::kSecretBytes);
  const bool same = std::memcmp(request->secret, secret.data(), secret.size()) == 0;
  FUZZ_CHECK(peer_wire::CarriesSecret(*request, secret) == same,
             same ? "refused the job's secret" : "accepted another secret");
  FUZZ_CHECK(!peer_wire::CarriesSecret(*request, secret.substr(1)) &&
                 !peer_wire::CarriesSecret(*request, absl::StrCat(secret, "x")) &&
                 !peer_wire::CarriesSecret(*request, ""),
             "accepted a secret of another length");
}

void FuzzReply(absl::string_view header, absl::string_view data, size_t expected_length) {
  absl::StatusOr<peer_wire::ReplyHeader> reply = peer_wire::DecodeReplyHeader(header);
  if (!reply.ok()) {
    FUZZ_CHECK(reply.status().code() == absl::StatusCode::kInvalidArgument,
               reply.status().ToString());
    CheckRefusal(reply.status());
    return;
  }
  FUZZ_CHECK(header.size() == sizeof(peer_wire::ReplyHeader), absl::StrCat(header.size()));
  FUZZ_CHECK(std::memcmp(&*reply, header.data(), header.size()) == 0,
             "does not re-encode to the bytes received");
  const int rank = 1;
  const absl::Status verdict = peer_wire::CheckReply(*reply, data.size(), expected_length, rank);
  if (!verdict.ok()) {
    FUZZ_CHECK(verdict.code() == absl::StatusCode::kDataLoss ||
                   verdict.code() == absl::StatusCode::kUnavailable,
               verdict.ToString());
    CheckRefusal(verdict);
    return;
  }
  FUZZ_CHECK(reply->protocol == peer_wire::kProtocol && reply->status_code == 0,
             absl::StrCat("accepted a reply of protocol ", reply->protocol, ", status ",
                          reply->status_code));
  FUZZ_CHECK(reply->length == expected_length && data.size() == expected_length,
             absl::StrCat("accepted ", data.size(), " bytes (header: ", reply->length,
                          ") for a request of ", expected_length));
  // What the requester does next: copy into the receive buffer, exactly the
  // request's length, then compare the checksum of the copy.
  auto buffer = std::make_unique<char[]>(expected_length + 1);
  const uint32_t copied = Crc32cCopy(buffer.get(), data.data(), expected_length);
  FUZZ_CHECK(copied == Crc32c(data.data(), data.size()), "Crc32cCopy != Crc32c");
  FUZZ_CHECK(std::memcmp(buffer.get(), data.data(), expected_length) == 0, "copy differs");
}

void FuzzGoodbye(absl::string_view header, int my_rank, int size) {
  absl::StatusOr<int> rank = peer_wire::DecodeGoodbye(header, my_rank, size);
  if (!rank.ok()) {
    FUZZ_CHECK(rank.status().code() == absl::StatusCode::kInvalidArgument,
               rank.status().ToString());
    CheckRefusal(rank.status());
    return;
  }
  FUZZ_CHECK(header.size() == 4, absl::StrCat(header.size()));
  FUZZ_CHECK(
      *rank >= 0 && *rank < size && *rank != my_rank,
      absl::StrCat("goodbye from rank ", *rank, " in a job of ", size, " as rank ", my_rank));
}

}  // namespace
}  // namespace monarch

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size < monarch::kPrefixBytes) return 0;
  const int which = bytes[0] % 3;
  const int my_rank = bytes[1];
  const int job_size = bytes[2];
  uint32_t expected_length;
  std::memcpy(&expected_length, bytes + 4, sizeof(expected_length));
  const absl::string_view rest(reinterpret_cast<const char*>(bytes) + monarch::kPrefixBytes,
                               size - monarch::kPrefixBytes);
  const absl::string_view header = rest.substr(0, bytes[3]);
  const absl::string_view data = rest.substr(header.size());
  switch (which) {
    case 0:
      monarch::FuzzRequest(header, data, my_rank, job_size);
      break;
    case 1:
      monarch::FuzzReply(header, data, expected_length);
      break;
    case 2:
      monarch::FuzzGoodbye(header, my_rank, job_size);
      break;
  }
  return 0;
}
