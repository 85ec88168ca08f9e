// What a guest's nvidia-smi prints (agent/guest/nvidia_smi.hpp): the CSV
// query with and without its header, `-q -x`, the table and `-L`. The guest
// is the customer's, so its nvidia-smi may print anything: every parser gives
// a report or an error, never a crash or an exception. The first byte picks
// the parser so one corpus covers all five; the seeds are the real captures
// (tests/fixtures/real/) behind their selector byte.
#include "agent/guest/nvidia_smi.hpp"

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace factory::agent;
  switch (data[0] % 5) {
    case 0:
      (void)parse_nvidia_smi_csv(text, nvidia_smi_query_fields());
      break;
    case 1:
      (void)parse_nvidia_smi_csv_with_header(text);
      break;
    case 2:
      (void)parse_nvidia_smi_xml(text);
      break;
    case 3:
      (void)parse_nvidia_smi_table(text);
      break;
    case 4:
      (void)parse_nvidia_smi_list(text);
      break;
  }
  return 0;
}
