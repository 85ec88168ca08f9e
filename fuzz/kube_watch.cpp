// A watch stream from the host's API server (coordinator/kube/client.hpp
// parse_watch_line): newline-delimited {"type", "object"} events, where a
// proxy in front of the server may send anything. Each line is either an
// event of that shape or a protocol error, never an exception.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "coordinator/kube/client.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view stream(reinterpret_cast<const char*>(data), size);
  std::size_t at = 0;
  while (at <= stream.size()) {
    std::size_t nl = stream.find('\n', at);
    if (nl == std::string_view::npos) nl = stream.size();
    auto ev = factory::kube::parse_watch_line(stream.substr(at, nl - at));
    if (ev && !ev->object.is_object()) std::abort();
    at = nl + 1;
  }
  return 0;
}
