#include "coordinator/host/quarantine.hpp"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/atomic_file.hpp"

namespace factory::host {

using nlohmann::json;

Result<std::vector<CardRecord>> read_cards(const HostRoot& root) {
  const auto path = root(kCardsFile);
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::vector<CardRecord>{};
  auto text = read_file(path);
  if (!text) return text.error();
  json j = json::parse(*text, nullptr, false);
  if (!j.is_object() || !j.contains("cards") || !j["cards"].is_array())
    return Error(Errc::protocol, std::string(kCardsFile) +
                                     " is not Factory's card file: fix or remove it (it lists "
                                     "the quarantined cards)");
  std::vector<CardRecord> out;
  for (const auto& c : j["cards"]) {
    if (!c.is_object() || !c.contains("address") || !c["address"].is_string()) continue;
    CardRecord r;
    r.address = c["address"];
    r.quarantined = c.value("quarantined", false);
    r.reason = c.value("reason", "");
    r.quarantined_at = c.value("quarantined_at", "");
    r.released_at = c.value("released_at", "");
    r.uuid = c.value("uuid", "");
    r.serial = c.value("serial", "");
    out.push_back(std::move(r));
  }
  return out;
}

Status write_cards(const HostRoot& root, const std::vector<CardRecord>& cards) {
  json list = json::array();
  for (const auto& c : cards)
    list.push_back({{"address", c.address},
                    {"quarantined", c.quarantined},
                    {"reason", c.reason},
                    {"quarantined_at", c.quarantined_at},
                    {"released_at", c.released_at},
                    {"uuid", c.uuid},
                    {"serial", c.serial}});
  const auto path = root(kCardsFile);
  if (auto st = ensure_dir(path.parent_path(), 0755); !st.ok()) return st;
  return write_file_atomic(path, json{{"version", 1}, {"cards", list}}.dump(2) + "\n", 0600);
}

const CardRecord* find_card(const std::vector<CardRecord>& cards, const std::string& address) {
  auto it = std::find_if(cards.begin(), cards.end(),
                         [&](const CardRecord& c) { return c.address == address; });
  return it == cards.end() ? nullptr : &*it;
}

CardRecord& card_record(std::vector<CardRecord>& cards, const std::string& address) {
  auto it = std::find_if(cards.begin(), cards.end(),
                         [&](const CardRecord& c) { return c.address == address; });
  if (it != cards.end()) return *it;
  cards.push_back(CardRecord{});
  cards.back().address = address;
  return cards.back();
}

Status check_reason(const std::string& reason) {
  if (reason.empty())
    return Error(Errc::invalid_argument,
                 "--reason is empty: say why the card is out (\"Xid 79 on tenant-1\")");
  if (reason.size() > 256)
    return Error(Errc::invalid_argument, "--reason is longer than 256 bytes");
  for (unsigned char c : reason)
    if (c < 0x20 || c == 0x7f)
      return Error(Errc::invalid_argument, "--reason holds a control character");
  return ok_status();
}

}  // namespace factory::host
