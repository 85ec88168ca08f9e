// The plan journal as a crash or a full disk may leave it
// (agent/plan/journal.hpp): any bytes parse into a journal or an error
// naming the problem; what parses saves back to a document that parses.
#include <cstddef>
#include <cstdint>

#include "agent/plan/journal.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto j = factory::agent::PlanJournal::parse(text);
  if (j) {
    (void)j->steps_done();
    (void)j->to_json().dump();
  }
  return 0;
}
