// Stats::ToJson: the one place counters become text.

#include "monarch/stats.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace monarch {
namespace {

void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out->append(escaped);
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

}  // namespace

std::string Stats::ToJson() const {
  std::string out = "{\"tiers\":[";
  for (size_t i = 0; i < tiers.size(); ++i) {
    const TierStats& t = tiers[i];
    if (i > 0) out.push_back(',');
    out.append("{\"name\":");
    AppendJsonString(&out, t.name);
    out.append(",\"kind\":");
    AppendJsonString(&out, t.kind);
    absl::StrAppend(&out, ",\"reads\":", t.reads, ",\"bytes_read\":", t.bytes_read,
                    ",\"files\":", t.files, ",\"bytes_used\":", t.bytes_used,
                    ",\"capacity\":", t.capacity, ",\"read_errors\":", t.read_errors,
                    ",\"write_errors\":", t.write_errors, "}");
  }
  absl::StrAppend(
      &out, "],\"promotions_started\":", promotions_started,
      ",\"promotions_completed\":", promotions_completed,
      ",\"promotions_failed\":", promotions_failed, ",\"promotions_skipped\":", promotions_skipped,
      ",\"promotions_cancelled\":", promotions_cancelled, ",\"staging_reads\":", staging_reads,
      ",\"staging_bytes_read\":", staging_bytes_read, ",\"staging_hits\":", staging_hits,
      ",\"staging_fallbacks\":", staging_fallbacks, ",\"staging_bytes\":", staging_bytes,
      ",\"staging_peak_bytes\":", staging_peak_bytes,
      ",\"chunks_written_by_placement\":", chunks_written_by_placement,
      ",\"chunks_written_by_readers\":", chunks_written_by_readers,
      ",\"warm_files_reused\":", warm_files_reused,
      ",\"warm_files_discarded\":", warm_files_discarded);
  const RemoteStats& r = remote;
  absl::StrAppend(
      &out, ",\"remote\":{\"enabled\":", r.enabled ? "true" : "false", ",\"rank\":", r.rank,
      ",\"peers\":", r.peers, ",\"buffer_bytes\":", r.buffer_bytes,
      ",\"home_files\":", r.home_files, ",\"peer_reads\":", r.peer_reads,
      ",\"peer_bytes_read\":", r.peer_bytes_read, ",\"fallbacks\":", r.fallbacks,
      ",\"down_skips\":", r.down_skips, ",\"peer_wait_ns\":", r.peer_wait_ns,
      ",\"requests_served\":", r.requests_served, ",\"bytes_served\":", r.bytes_served,
      ",\"requests_refused\":", r.requests_refused, ",\"timeouts\":", r.timeouts,
      ",\"peer_failures\":", r.peer_failures, ",\"checksum_failures\":", r.checksum_failures, "}}");
  return out;
}

}  // namespace monarch
