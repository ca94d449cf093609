// PhantoraNetwork::EffectiveParams: the settings the fabric runs by, read back from its objects (issue 35: the
// ns-3 side reports its effective values, so Python never recomputes them).
#include "phantora-network-impl.h"

#include "ns3/string.h"

#include <cstdio>
#include <stdexcept>

namespace ns3 {

namespace {

using Params = std::vector<std::pair<std::string, std::string>>;

/// Every readable attribute of `obj` (its TypeId's and its parents'), as "scope.Name" = ns-3's text of it.
/// Attributes holding objects or callbacks (no stable text) are left out.
void AddAttributes(const std::string& scope, const ObjectBase& obj, Params& out) {
  for (TypeId tid = obj.GetInstanceTypeId();; tid = tid.GetParent()) {
    for (std::size_t i = 0; i < tid.GetAttributeN(); ++i) {
      const TypeId::AttributeInformation info = tid.GetAttribute(i);
      const std::string type = info.checker->GetValueTypeName();
      if (!(info.flags & TypeId::ATTR_GET) || !info.accessor->HasGetter() || type.find("Pointer") != std::string::npos ||
          type.find("Object") != std::string::npos || type.find("Callback") != std::string::npos) {
        continue;
      }
      StringValue text;
      if (obj.GetAttributeFailSafe(info.name, text)) {
        out.emplace_back(scope + "." + info.name, text.Get());
      }
    }
    if (tid == tid.GetParent() || tid.GetParent() == ObjectBase::GetTypeId()) {
      break;
    }
  }
}

std::string Text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> PhantoraNetwork::EffectiveParams() const {
  const Impl& s = Need();
  if (!s.finalized) {
    throw std::runtime_error("EffectiveParams() before Finalize()");
  }
  Params out;
  AddAttributes("fabric", *s.fabric, out);
  AddAttributes("recorder", *s.recorder, out);
  const PhantoraFabric& fabric = *s.fabric;
  Ptr<RdmaNic> nic;
  Ptr<PfcSwitch> sw;
  Ptr<PfcSwitch> nvswitch;
  for (uint32_t n = 0; n < fabric.NumNodes(); ++n) {
    const PhantoraFabric::NodeInfo& info = fabric.GetNode(n);
    nic = nic ? nic : info.nic;
    if (info.sw && info.kind == NodeKind::NvSwitch) {
      nvswitch = nvswitch ? nvswitch : info.sw;
    } else if (info.sw) {
      sw = sw ? sw : info.sw;
    }
  }
  if (nic) {
    AddAttributes("nic", *nic, out);
  }
  if (sw || nvswitch) {
    AddAttributes("switch", sw ? *sw : *nvswitch, out);
  }
  AddAttributes("cc", *s.installer.CcFactory().Create(), out);
  for (uint32_t n = 0; n < fabric.NumNodes(); ++n) {
    const PhantoraFabric::NodeInfo& info = fabric.GetNode(n);
    if (!info.sw || info.kind != NodeKind::Switch) {
      continue;
    }
    const std::string at = "switch/" + std::to_string(n) + "/";
    out.emplace_back(at + "BufferBytes", std::to_string(info.sw->Mmu().GetConfig().bufferBytes));
    for (uint32_t p = 0; p < info.sw->NumPorts(); ++p) {
      const PfcSwitch::PortSettings r = info.sw->ResolvedPort(p);
      const std::string port = at + std::to_string(p) + "/";
      out.emplace_back(port + "RateBps", std::to_string(r.rateBps));
      out.emplace_back(port + "Kmin", std::to_string(r.kmin));
      out.emplace_back(port + "Kmax", std::to_string(r.kmax));
      out.emplace_back(port + "Pmax", Text(r.pmax));
      out.emplace_back(port + "HeadroomBytes", std::to_string(r.headroomBytes));
    }
  }
  return out;
}

}  // namespace ns3
