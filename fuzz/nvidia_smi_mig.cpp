// What a guest's nvidia-smi prints about MIG (agent/guest/mig.hpp): -lgip,
// -lgi, -lci, -L with MIG devices, the MIG mode query, -mig's answer and
// -cgi -C's. The guest is the customer's: every parser gives a value or an
// error, never a crash or an exception. The first byte picks the parser;
// the seeds are the real H200's -lgip capture and NVIDIA's documented
// layouts behind their selector byte.
#include <cstddef>
#include <cstdint>

#include "agent/guest/mig.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  using namespace factory::agent;
  switch (data[0] % 7) {
    case 0:
      (void)parse_mig_profiles(text);
      break;
    case 1:
      (void)parse_mig_gpu_instances(text);
      break;
    case 2:
      (void)parse_mig_compute_instances(text);
      break;
    case 3:
      (void)parse_mig_devices(text);
      break;
    case 4:
      (void)parse_mig_modes(text);
      break;
    case 5:
      (void)parse_mig_mode_change(text, static_cast<int>(size % 256));
      break;
    case 6:
      (void)parse_mig_create(text);
      break;
  }
  return 0;
}
