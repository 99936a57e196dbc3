// The libFuzzer entry point of one fuzzer binary: compiled once per target with
// -DPD_FUZZ_ENTRY=<its harness function> (tests/fuzz/CMakeLists.txt).
#include "tests/fuzz/fuzz_targets.h"

#ifndef PD_FUZZ_ENTRY
#error "compile with -DPD_FUZZ_ENTRY=<one of the functions in fuzz_targets.h>"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return pd::fuzz::PD_FUZZ_ENTRY(data, size);
}
