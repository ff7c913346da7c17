// Stats: lookups, and the one place counters become text (JSON, Prometheus).

#include "monarch/stats.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace monarch {
namespace {

void AppendJsonString(std::string* out, std::string_view s) {
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

// Label values in the Prometheus text format escape \, " and newlines.
std::string PrometheusLabel(std::string_view value) {
  return absl::StrReplaceAll(absl::string_view(value.data(), value.size()),
                             {{"\\", "\\\\"}, {"\"", "\\\""}, {"\n", "\\n"}});
}

}  // namespace

uint64_t Stats::Get(std::string_view name) const {
  for (const Metric& m : metrics) {
    if (m.tier.empty() && m.name == name) return m.value;
  }
  return 0;
}

std::vector<std::string> Stats::TierNames() const {
  std::vector<std::string> names;
  for (const Metric& m : metrics) {
    if (!m.tier.empty() && std::find(names.begin(), names.end(), m.tier) == names.end()) {
      names.push_back(m.tier);
    }
  }
  return names;
}

uint64_t Stats::Tier(size_t index, std::string_view name) const {
  const std::vector<std::string> names = TierNames();
  if (index >= names.size()) return 0;
  for (const Metric& m : metrics) {
    if (m.tier == names[index] && m.name == name) return m.value;
  }
  return 0;
}

uint64_t Stats::Source(std::string_view name) const {
  const size_t tiers = TierNames().size();
  return tiers == 0 ? 0 : Tier(tiers - 1, name);
}

std::string Stats::ToJson() const {
  std::string out = "{";
  bool first = true;
  // Appends "k":value to the object `s`, whose first member is still to come
  // if `*first_in`.
  auto member = [&](std::string* s, bool* first_in, std::string_view k,
                    const absl::AlphaNum& value) {
    if (!*first_in) s->push_back(',');
    *first_in = false;
    AppendJsonString(s, k);
    absl::StrAppend(s, ":", value);
  };
  // General metrics; a "group." prefix becomes a nested object.
  std::map<std::string, std::string> groups;  // group -> its members' JSON
  std::vector<std::string> group_order;
  for (const Metric& m : metrics) {
    if (!m.tier.empty()) continue;
    const size_t dot = m.name.find('.');
    if (dot == std::string::npos) {
      member(&out, &first, m.name, m.value);
      continue;
    }
    const std::string group = m.name.substr(0, dot);
    auto [it, inserted] = groups.emplace(group, "");
    if (inserted) group_order.push_back(group);
    bool group_first = it->second.empty();
    member(&it->second, &group_first, m.name.substr(dot + 1), m.value);
  }
  for (const std::string& group : group_order) {
    member(&out, &first, group, absl::StrCat("{", groups[group], "}"));
  }
  member(&out, &first, "tiers", "[");
  const std::vector<std::string> tiers = TierNames();
  for (size_t t = 0; t < tiers.size(); ++t) {
    if (t > 0) out.push_back(',');
    std::string body;
    bool tier_first = true;
    std::string kind;
    for (const Metric& m : metrics) {
      if (m.tier != tiers[t]) continue;
      kind = m.tier_kind;
      member(&body, &tier_first, m.name, m.value);
    }
    out.append("{\"name\":");
    AppendJsonString(&out, tiers[t]);
    out.append(",\"kind\":");
    AppendJsonString(&out, kind);
    if (!body.empty()) absl::StrAppend(&out, ",", body);
    out.push_back('}');
  }
  out.append("]}");
  return out;
}

std::string Stats::ToPrometheus() const {
  // One HELP/TYPE block per metric name, then a sample per tier (or one).
  std::vector<std::string> order;
  std::map<std::string, std::vector<const Metric*>> by_name;
  for (const Metric& m : metrics) {
    // Prometheus names counters "..._total".
    std::string name = absl::StrCat(
        "monarch_", m.tier.empty() ? "" : "tier_",
        absl::StrReplaceAll(absl::string_view(m.name.data(), m.name.size()), {{".", "_"}}),
        m.kind == Metric::Kind::kCounter ? "_total" : "");
    auto [it, inserted] = by_name.emplace(name, std::vector<const Metric*>());
    if (inserted) order.push_back(name);
    it->second.push_back(&m);
  }
  std::string out;
  for (const std::string& name : order) {
    const std::vector<const Metric*>& samples = by_name[name];
    absl::StrAppend(&out, "# HELP ", name, " ",
                    absl::StrReplaceAll(samples[0]->help, {{"\\", "\\\\"}, {"\n", "\\n"}}), "\n",
                    "# TYPE ", name, " ",
                    samples[0]->kind == Metric::Kind::kCounter ? "counter" : "gauge", "\n");
    for (const Metric* m : samples) {
      absl::StrAppend(&out, name);
      if (!m->tier.empty()) {
        absl::StrAppend(&out, "{tier=\"", PrometheusLabel(m->tier), "\",kind=\"",
                        PrometheusLabel(m->tier_kind), "\"}");
      }
      absl::StrAppend(&out, " ", m->value, "\n");
    }
  }
  return out;
}

}  // namespace monarch
