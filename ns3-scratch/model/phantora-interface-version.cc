// PhantoraInterfaceVersion(): the interface version this library is built with (phantora-interface-version.h).
#include "phantora-interface-version.h"

namespace ns3 {

extern "C" uint32_t PhantoraInterfaceVersion() { return kPhantoraInterfaceVersion; }

}  // namespace ns3
