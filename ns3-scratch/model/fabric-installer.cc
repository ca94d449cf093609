// FabricInstaller: attribute checking and installation of the fabric's NICs and switches.
#include "fabric-installer.h"

#include "congestion-control.h"

#include "ns3/boolean.h"
#include "ns3/string.h"

#include <cctype>
#include <set>
#include <sstream>
#include <stdexcept>

namespace ns3 {

namespace {

/// Would ns-3 parse `text` as a value of this checker's type?
bool ParsableAs(const AttributeChecker& checker, const std::string& text) {
  const std::string valueType = checker.GetValueTypeName();
  auto whole = [&](auto parse) {
    std::size_t pos = 0;
    try {
      parse(text, &pos);
    } catch (const std::exception&) {
      return false;
    }
    return pos == text.size() && !text.empty();
  };
  if (valueType == "ns3::DoubleValue") {
    return whole([](const std::string& t, std::size_t* p) { return std::stod(t, p); });
  }
  if (valueType == "ns3::UintegerValue") {
    return !text.empty() && text[0] != '-' &&
           whole([](const std::string& t, std::size_t* p) { return std::stoull(t, p); });
  }
  if (valueType == "ns3::IntegerValue") {
    return whole([](const std::string& t, std::size_t* p) { return std::stoll(t, p); });
  }
  if (valueType == "ns3::BooleanValue") {
    return text == "true" || text == "false" || text == "1" || text == "0";
  }
  if (valueType == "ns3::TimeValue") {
    std::size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                               text[i] == 'e' || text[i] == '+' || text[i] == '-')) {
      ++i;
    }
    static const std::set<std::string> units = {"", "s", "ms", "us", "ns", "ps", "fs", "min", "h", "d", "y"};
    std::size_t pos = 0;
    try {
      std::stod(text.substr(0, i), &pos);
    } catch (const std::exception&) {
      return false;
    }
    return pos == i && units.count(text.substr(i)) > 0;
  }
  if (valueType.rfind("ns3::EnumValue", 0) == 0 && checker.HasUnderlyingTypeInformation()) {
    std::istringstream names(checker.GetUnderlyingTypeInformation());
    for (std::string name; std::getline(names, name, '|');) {
      if (name == text) {
        return true;
      }
    }
    return false;
  }
  return valueType == "ns3::StringValue";
}

/// The attribute names of `tid` and its parents up to CongestionControl, comma-separated.
std::string CcAttributeNames(TypeId tid) {
  std::set<std::string> names;
  for (TypeId t = tid; t != CongestionControl::GetTypeId() && t != t.GetParent(); t = t.GetParent()) {
    for (std::size_t i = 0; i < t.GetAttributeN(); ++i) {
      names.insert(t.GetAttribute(i).name);
    }
  }
  std::string out;
  for (const auto& n : names) {
    out += (out.empty() ? "" : ", ") + n;
  }
  return out.empty() ? "none" : out;
}

}  // namespace

Ptr<AttributeValue> AttributeFromText(TypeId tid, const std::string& name, const std::string& text,
                                      const std::string& what) {
  TypeId::AttributeInformation info;
  if (!tid.LookupAttributeByName(name, &info)) {
    throw std::invalid_argument(what + " has no attribute '" + name + "'");
  }
  Ptr<AttributeValue> v;
  if (ParsableAs(*info.checker, text)) {
    v = info.checker->CreateValidValue(StringValue(text));
  }
  if (!v) {
    throw std::invalid_argument("attribute '" + name + "' of " + what + ": bad value '" + text + "'");
  }
  return v;
}

FabricInstaller::FabricInstaller() {
  m_nic.SetTypeId(RdmaNic::GetTypeId());
  m_switch.SetTypeId(PfcSwitch::GetTypeId());
}

void FabricInstaller::SetNicAttribute(const std::string& name, const std::string& text) {
  m_nic.Set(name, *AttributeFromText(RdmaNic::GetTypeId(), name, text, "the NIC (ns3::RdmaNic)"));
}

void FabricInstaller::SetSwitchAttribute(const std::string& name, const std::string& text) {
  m_switch.Set(name, *AttributeFromText(PfcSwitch::GetTypeId(), name, text, "the switch (ns3::PfcSwitch)"));
}

void FabricInstaller::SetCcAttribute(const std::string& name, const std::string& text) {
  m_ccAttributes.emplace_back(name, text);
}

void FabricInstaller::Install(Ptr<PhantoraFabric> fabric, RdmaNic::FlowCallback dataComplete,
                                   RdmaNic::FlowCallback senderDone) {
  // Congestion control: check the type and every attribute before anything can abort inside ns-3.
  const std::string& ccName = fabric->GetCongestionControl();
  const TypeId ccTid = CcRegistry::Lookup(ccName);
  ObjectFactory cc;
  cc.SetTypeId(ccTid);
  for (const auto& [name, text] : m_ccAttributes) {
    TypeId::AttributeInformation info;
    if (!ccTid.LookupAttributeByName(name, &info)) {
      throw std::invalid_argument("congestion control '" + ccName + "' has no attribute '" + name +
                                  "' (its attributes: " + CcAttributeNames(ccTid) + ")");
    }
    cc.Set(name, *AttributeFromText(ccTid, name, text, "congestion control '" + ccName + "'"));
  }
  m_cc = cc;
  const PhantoraFabric::IntMode mode = fabric->GetIntMode();
  m_intOn = mode == PhantoraFabric::INT_ON ||
            (mode == PhantoraFabric::INT_AUTO && cc.Create<CongestionControl>()->WantsInt());
  m_nic.Set("IntEnabled", BooleanValue(m_intOn));
  m_switch.Set("IntEnabled", BooleanValue(m_intOn));

  PhantoraFabric* raw = PeekPointer(fabric);  // the fabric outlives its NICs (it disposes them)
  const RdmaNic::PathQuery baseRtt = MakeCallback(&PhantoraFabric::CcBaseRttNs, raw);
  const RdmaNic::PathQuery bdp = MakeCallback(&PhantoraFabric::CcBdpBytes, raw);
  for (uint32_t n = 0; n < fabric->NumNodes(); ++n) {
    PhantoraFabric::NodeInfo& info = fabric->GetNode(n);
    if (IsEndpoint(info.kind)) {
      info.nic = m_nic.Create<RdmaNic>();
      info.nic->Install(info.node, n, fabric->GetRoutes());
      info.nic->SetCongestionControlFactory(cc);
      info.nic->SetFlowCallbacks(dataComplete, senderDone);
      info.nic->SetCcPathQueries(baseRtt, bdp);
    } else {
      info.sw = m_switch.Create<PfcSwitch>();
      info.sw->SetAttribute("NvSwitch", BooleanValue(info.kind == NodeKind::NvSwitch));
      info.sw->Install(info.node, n, fabric->GetRoutes());
    }
  }
}

}  // namespace ns3
