// The websocket decoder (common/net/ws_codec.hpp) on whatever bytes a peer
// sends, split at a point the input chooses: it must never crash, never hold
// more than the limit, and a message it yields must respect the limit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "common/net/ws_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::size_t limit = 1 + data[0] * 64;
  const std::size_t cut = data[1] % size;
  std::string_view bytes(reinterpret_cast<const char*>(data + 2), size - 2);
  factory::net::ws::Decoder d(limit);
  std::vector<factory::net::ws::Message> out;
  d.feed(bytes.substr(0, std::min(cut, bytes.size())), out);
  d.feed(bytes.substr(std::min(cut, bytes.size())), out);
  for (auto& m : out)
    if ((m.op == factory::net::ws::Opcode::text || m.op == factory::net::ws::Opcode::binary) &&
        m.payload.size() > limit)
      std::abort();
  if (d.buffered() > limit + 14 + bytes.size()) std::abort();
  return 0;
}
