// The version of the interface between the models and their callers: Python (phantora.netsim, through cppyy)
// and the standalone runner (phantora-ns3-runner). It covers PhantoraNetwork's calls (phantora-network.h), the
// record structs they hand back and the packed layouts (AddFlows' words, StepToCompletion's, UnpackIds').
//
// Bump kPhantoraInterfaceVersion with every change to that interface a caller must follow (an argument, a
// field, a word of a packed layout, a call added that callers make), and phantora/netsim/ns3_abi.py's
// INTERFACE_VERSION with it (docs/packet-model.md, "Interface version"). Python refuses a library of another
// version, or one without PhantoraInterfaceVersion(); the runner refuses a library other than the one it was
// built with.
#ifndef PHANTORA_INTERFACE_VERSION_H
#define PHANTORA_INTERFACE_VERSION_H

#include <cstdint>

namespace ns3 {

/// 1 (2026-12-02): AddFlow's viaNic argument and AddFlows' 9 words a flow (6cf8bae8); libraries before have no
/// PhantoraInterfaceVersion().
constexpr uint32_t kPhantoraInterfaceVersion = 1;

/// kPhantoraInterfaceVersion as the library was built with it. C linkage, so a caller finds it by its plain name
/// (dlsym, ctypes) without the library's headers.
extern "C" uint32_t PhantoraInterfaceVersion();

}  // namespace ns3

#endif  // PHANTORA_INTERFACE_VERSION_H
