// The wire envelope (contract/protocol.hpp) as an agent or a stranger may send
// it: parse never throws, and whatever it accepts serializes back to JSON.
#include <cstddef>
#include <cstdint>

#include "contract/protocol.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view frame(reinterpret_cast<const char*>(data), size);
  auto env = factory::proto::parse(frame);
  if (env) (void)factory::proto::serialize(*env);
  return 0;
}
