#include "contract/protocol.hpp"

namespace factory::proto {

size_t max_frame_bytes_for(std::string_view t) {
  if (t == type::kPlan) return kMaxPlanFrameBytes;
  if (t == type::kEnroll) return kMaxEnrollFrameBytes;
  return kMaxFrameBytes;
}

Result<Envelope> parse(std::string_view frame) {
  if (frame.size() > kMaxPlanFrameBytes)
    return Error(Errc::protocol, "frame of " + std::to_string(frame.size()) +
                                     " bytes exceeds the cap of " +
                                     std::to_string(kMaxPlanFrameBytes));
  auto j = nlohmann::json::parse(frame, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error(Errc::protocol, "frame is not valid JSON");
  if (!j.is_object()) return Error(Errc::protocol, "frame is not a JSON object");
  Envelope e;
  auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer())
    return Error(Errc::protocol, "frame has no protocol version 'v'");
  e.v = v->get<int>();
  if (e.v != kVersion)
    return Error(Errc::protocol, "unsupported protocol version " + std::to_string(e.v) +
                                     " (this side speaks " + std::to_string(kVersion) + ")");
  auto t = j.find("type");
  if (t == j.end() || !t->is_string() || t->get_ref<const std::string&>().empty())
    return Error(Errc::protocol, "frame has no 'type'");
  e.type = t->get<std::string>();
  auto s = j.find("seq");
  if (s == j.end() || !s->is_number_unsigned())
    return Error(Errc::protocol, "frame has no sequence number 'seq'");
  e.seq = s->get<uint64_t>();
  if (frame.size() > max_frame_bytes_for(e.type))
    return Error(Errc::protocol, "frame of " + std::to_string(frame.size()) +
                                     " bytes exceeds the " +
                                     std::to_string(max_frame_bytes_for(e.type)) +
                                     "-byte cap for type '" + e.type + "'");
  if (auto a = j.find("ack"); a != j.end()) {
    if (!a->is_number_unsigned()) return Error(Errc::protocol, "'ack' is not a sequence number");
    e.ack = a->get<uint64_t>();
  }
  if (auto b = j.find("body"); b != j.end() && !b->is_null()) {
    if (!b->is_object()) return Error(Errc::protocol, "'body' is not an object");
    e.body = std::move(*b);
  }
  return e;
}

std::string serialize(const Envelope& e) {
  // Written field by field, in the order a JSON object of them would dump
  // (its keys sorted): only the body goes through the serializer, and it
  // is not copied into an envelope's tree first (a plan's body is large,
  // and every acknowledgement was a tree built and freed).
  std::string out = "{";
  if (e.ack) {
    out += "\"ack\":";
    out += std::to_string(*e.ack);
    out += ',';
  }
  out += "\"body\":";
  out += e.body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += ",\"seq\":";
  out += std::to_string(e.seq);
  out += ",\"type\":";
  out += nlohmann::json(e.type).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  out += ",\"v\":";
  out += std::to_string(e.v);
  out += '}';
  return out;
}

}  // namespace factory::proto
