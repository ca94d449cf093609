// Base congestion-control object, the registry of CCs by name, and CcNone (line rate, no window).
#include "congestion-control.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/object-factory.h"
#include "ns3/trace-source-accessor.h"

#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraCongestionControl");
NS_OBJECT_ENSURE_REGISTERED(CongestionControl);
PHANTORA_REGISTER_CC(CcNone, "none");

namespace {

/// name -> GetTypeId, filled at load time (a function-local static: safe in any static-initialisation order).
std::map<std::string, TypeId (*)()>& Registered() {
  static std::map<std::string, TypeId (*)()> table;
  return table;
}

/// `text` as a JSON string literal.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string Joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) {
    out += (out.empty() ? "" : ", ") + n;
  }
  return out;
}

}  // namespace

bool CcRegistry::Add(const std::string& name, TypeId (*getTypeId)()) {
  auto [it, added] = Registered().emplace(name, getTypeId);
  if (!added && it->second != getTypeId) {  // e.g. a user's CC under a built-in name: the first one stays
    std::cerr << "phantora: congestion control '" << name << "' is registered twice (" << it->second().GetName()
              << ", " << getTypeId().GetName() << "); keeping " << it->second().GetName() << std::endl;
  }
  return true;
}

std::vector<std::string> CcRegistry::Names() {
  std::vector<std::string> out;
  for (const auto& [name, _] : Registered()) {
    out.push_back(name);
  }
  return out;
}

TypeId CcRegistry::Lookup(const std::string& name) {
  auto it = Registered().find(name);
  if (it != Registered().end()) {
    return it->second();
  }
  TypeId tid;
  if (TypeId::LookupByNameFailSafe(name, &tid) && tid.IsChildOf(CongestionControl::GetTypeId()) &&
      tid.HasConstructor()) {
    return tid;
  }
  throw std::invalid_argument("unknown congestion control '" + name + "' (registered: " + Joined(Names()) + ")");
}

std::string CcRegistry::Json() {
  std::ostringstream out;
  out << "{";
  bool firstCc = true;
  for (const auto& [name, getTypeId] : Registered()) {
    const TypeId tid = getTypeId();
    ObjectFactory factory(tid.GetName());
    const bool wantsInt = factory.Create<CongestionControl>()->WantsInt();
    std::map<std::string, std::string> attrs;  // sorted by name; a subclass's attribute hides its parent's
    for (TypeId t = tid; t != CongestionControl::GetTypeId() && t != t.GetParent(); t = t.GetParent()) {
      for (std::size_t i = 0; i < t.GetAttributeN(); ++i) {
        const TypeId::AttributeInformation info = t.GetAttribute(i);
        if (attrs.count(info.name)) {
          continue;
        }
        attrs[info.name] = "{\"type\": " + Quoted(info.checker->GetValueTypeName()) +
                           ", \"default\": " + Quoted(info.initialValue->SerializeToString(info.checker)) +
                           ", \"help\": " + Quoted(info.help) + "}";
      }
    }
    out << (firstCc ? "" : ", ") << Quoted(name) << ": {\"typeid\": " << Quoted(tid.GetName())
        << ", \"wants_int\": " << (wantsInt ? "true" : "false") << ", \"attributes\": {";
    bool firstAttr = true;
    for (const auto& [attr, text] : attrs) {
      out << (firstAttr ? "" : ", ") << Quoted(attr) << ": " << text;
      firstAttr = false;
    }
    out << "}}";
    firstCc = false;
  }
  out << "}";
  return out.str();
}

TypeId CongestionControl::GetTypeId() {
  static TypeId tid = TypeId("ns3::CongestionControl")
                          .SetParent<Object>()
                          .SetGroupName("Phantora")
                          .AddTraceSource("Rate", "Pacing rate of the queue pair (bit/s)",
                                          MakeTraceSourceAccessor(&CongestionControl::m_rateBps),
                                          "ns3::TracedValueCallback::Uint64");
  return tid;
}

void CongestionControl::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  NS_LOG_FUNCTION(this << lineRateBps << baseRttNs << mtuBytes << bdpBytes);
  m_lineRateBps = lineRateBps;
  m_rateBps = lineRateBps;
  m_windowBytes = 0;
  m_bdpBytes = bdpBytes;
}

TypeId CongestionControl::AddCreditAttributes(TypeId tid, bool on) {
  return tid
      .AddAttribute("ReceiverCredit",
                    "Send only against credit the receiver grants (UET RCCC), beyond a speculative first round trip",
                    BooleanValue(on), MakeBooleanAccessor(&CongestionControl::m_creditOn), MakeBooleanChecker())
      .AddAttribute("SpeculativeCredit", "ReceiverCredit: bytes sent before the first grant, in BDPs of the path",
                    DoubleValue(1.0), MakeDoubleAccessor(&CongestionControl::m_speculativeBdps),
                    MakeDoubleChecker<double>(0.0))
      .AddAttribute("MaxCredit", "ReceiverCredit: most credit asked for ahead of the bytes sent, in BDPs",
                    DoubleValue(1.5), MakeDoubleAccessor(&CongestionControl::m_maxCreditBdps),
                    MakeDoubleChecker<double>(0.01));
}

uint64_t CongestionControl::SpeculativeCreditBytes() const {
  return static_cast<uint64_t>(m_speculativeBdps * static_cast<double>(m_bdpBytes));
}

uint64_t CongestionControl::MaxCreditBytes() const {
  return static_cast<uint64_t>(m_maxCreditBdps * static_cast<double>(m_bdpBytes));
}

uint64_t CongestionControl::GetRateBps() const { return m_rateBps.Get(); }

uint64_t CongestionControl::GetWindowBytes() const { return m_windowBytes; }

TypeId CcNone::GetTypeId() {
  static TypeId tid = PhantoraTypeId<CcNone, CongestionControl>("ns3::CcNone")
                          .AddAttribute("HasWindow", "Cap the bytes in flight at one BDP", BooleanValue(false),
                                        MakeBooleanAccessor(&CcNone::m_hasWindow), MakeBooleanChecker());
  return tid;
}

void CcNone::Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) {
  CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
  m_windowBytes = m_hasWindow ? bdpBytes : 0;
}

}  // namespace ns3
