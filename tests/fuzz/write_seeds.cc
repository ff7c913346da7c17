// Writes the binary seed inputs of the peer_wire and service_protocol
// corpora with the real encoders, so that the seeds are well-formed
// messages the fuzzers mutate from. Not run by the tests: the seeds are kept
// in the tree. Rerun after a change of either wire format:
//
//   build-fuzz/tests/fuzz/monarch_fuzz_write_seeds tests/fuzz/corpus
//
// Files it does not write (crashers found later) are left alone.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "remote/peer_network.h"
#include "service/protocol.h"

namespace monarch {
namespace {

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  return true;
}

template <typename T>
std::string Bytes(const T& value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(value));
}

// fuzz_peer_wire's layout: which, my rank, size, header length, expected length.
std::string PeerInput(int which, int my_rank, int size, const std::string& header,
                      uint32_t expected_length, const std::string& data) {
  std::string input;
  input += static_cast<char>(which);
  input += static_cast<char>(my_rank);
  input += static_cast<char>(size);
  input += static_cast<char>(header.size());
  input += Bytes(expected_length);
  return input + header + data;
}

bool WritePeerSeeds(const std::string& dir) {
  using peer_wire::kProtocol;
  using peer_wire::ReplyHeader;
  using peer_wire::RequestHeader;
  const std::string name = "train/n01440764/n01440764_10026.JPEG";
  RequestHeader request{kProtocol, 1, 7, 4096, 65536, 110592, 1700000000123456789, {}};
  // fuzz_peer_wire.cc's kFuzzSecret, so that the fuzzer starts from a
  // request its home accepts and mutates it into ones it refuses.
  std::memcpy(request.secret, "monarch fuzz job secret 32 bytes", sizeof(request.secret));
  RequestHeader stranger = request;
  stranger.secret[17] ^= 0x40;
  std::string data(300, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + 7);
  const ReplyHeader ok{kProtocol, 0, 7, data.size(), Crc32c(data.data(), data.size())};
  const ReplyHeader refused{kProtocol, 9, 7, 0, 0};  // FailedPrecondition: another version.
  const ReplyHeader short_reply{kProtocol, 0, 7, 100, 0};
  bool good = true;
  good &= Write(dir + "/request", PeerInput(0, 0, 2, Bytes(request), 0, name));
  good &= Write(dir + "/request-empty-name", PeerInput(0, 3, 8, Bytes(request), 0, ""));
  good &= Write(dir + "/request-other-secret", PeerInput(0, 0, 2, Bytes(stranger), 0, name));
  good &= Write(dir + "/reply-ok", PeerInput(1, 0, 2, Bytes(ok), data.size(), data));
  good &= Write(dir + "/reply-refused", PeerInput(1, 0, 2, Bytes(refused), 65536, ""));
  good &= Write(dir + "/reply-short", PeerInput(1, 0, 2, Bytes(short_reply), 300, data));
  good &= Write(dir + "/goodbye", PeerInput(2, 0, 4, Bytes(int32_t{3}), 0, ""));
  return good;
}

std::string Frame(service::MessageType type, const std::string& payload) {
  char header[service::kFrameHeaderBytes];
  service::EncodeFrameHeader(type, static_cast<uint32_t>(payload.size()), header);
  return std::string(header, sizeof(header)) + payload;
}

bool WriteServiceSeeds(const std::string& dir) {
  using namespace service;
  Hello hello;
  hello.dataset_root = "/lustre/datasets/imagenet";
  StageRequest stage;
  stage.globs = {"train/n014*/*.JPEG", "/lustre/datasets/imagenet/val/*"};
  HelloReply hello_reply;
  hello_reply.instance_id = 0x1234567890abcdefull;
  hello_reply.service_pid = 4242;
  hello_reply.file_count = 1281167;
  hello_reply.max_open_files = 256;
  hello_reply.buffer_bytes = 4 << 20;
  hello_reply.dataset_root = hello.dataset_root;
  hello_reply.tiers = {
      {0, "ram", "", 2}, {2, "nvme", "/mnt/nvme/monarch", 0}, {3, "source", "", 0}};
  StatsReply stats;
  Metric reads;
  reads.name = "tier.reads";
  reads.value = 12345;
  reads.help = "Reads served by this tier.";
  reads.tier = "ram";
  reads.tier_kind = "ram";
  Metric held;
  held.name = "tier.bytes_held";
  held.kind = Metric::Kind::kGauge;
  held.value = 1 << 30;
  held.help = "Bytes in this tier now.";
  held.tier = "nvme";
  held.tier_kind = "posix";
  stats.node.metrics = {reads, held};
  stats.clients = {{4243, 2, 100, 1 << 20, 5, 65536}};
  StageProgress progress{1000, 1 << 30, 400, 1 << 28, 390, 0};
  StatusReply status{4242, 12.5, hello.dataset_root, 3, 1281167, 150ull << 30, 1000, 1 << 30};
  ErrorReply error = ErrorReply::From(absl::NotFoundError("not a dataset file: x"));

  bool good = true;
  // What a client sends in one connection, then what it gets back.
  good &= Write(dir + "/client-session",
                Frame(MessageType::kHello, Encode(hello)) +
                    Frame(MessageType::kRead, Encode(ReadRequest{17, 4096, 65536})) +
                    Frame(MessageType::kStage, Encode(stage)) + Frame(MessageType::kStats, "") +
                    Frame(MessageType::kStatus, "") + Frame(MessageType::kWaitForPlacement, "") +
                    Frame(MessageType::kStop, ""));
  good &= Write(dir + "/service-replies",
                Frame(MessageType::kHelloReply, Encode(hello_reply)) +
                    Frame(MessageType::kReadReply, Encode(ReadReply{65536})) +
                    Frame(MessageType::kStageProgress, Encode(progress)) +
                    Frame(MessageType::kOk, "") + Frame(MessageType::kError, Encode(error)));
  good &= Write(dir + "/hello", Frame(MessageType::kHello, Encode(hello)));
  good &= Write(dir + "/stage-all", Frame(MessageType::kStage, Encode(StageRequest{})));
  good &= Write(dir + "/hello-reply", Frame(MessageType::kHelloReply, Encode(hello_reply)));
  good &= Write(dir + "/stats-reply", Frame(MessageType::kStatsReply, Encode(stats)));
  good &= Write(dir + "/status-reply", Frame(MessageType::kStatusReply, Encode(status)));
  good &= Write(dir + "/error", Frame(MessageType::kError, Encode(error)));
  // A client mapping a file asks which copies the service checked.
  good &= Write(dir + "/checked-copies",
                Frame(MessageType::kCheckedCopies, Encode(CheckedCopiesRequest{{3, 4, 70000}})) +
                    Frame(MessageType::kCheckedCopiesReply,
                          Encode(CheckedCopiesReply{{{3, SourceIdentity{2049, 1234567, 1052672,
                                                                    1700000000000000000,
                                                                    1700000000123456789}}}})) +
                    Frame(MessageType::kReadAhead, Encode(ReadAheadNotice{3, 8 << 20})));
  // A guest's proof of access (its descriptor travels beside the frame).
  good &= Write(dir + "/prove-access",
                Frame(MessageType::kProveAccess, Encode(ProveAccessRequest{17})) +
                    Frame(MessageType::kRead, Encode(ReadRequest{17, 0, 4096})));
  return good;
}

}  // namespace
}  // namespace monarch

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tests/fuzz/corpus>\n", argv[0]);
    return 2;
  }
  const std::string corpus = argv[1];
  const bool good = monarch::WritePeerSeeds(corpus + "/peer_wire") &&
                    monarch::WriteServiceSeeds(corpus + "/service_protocol");
  return good ? 0 : 1;
}
