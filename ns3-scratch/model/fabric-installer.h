// FabricInstaller: installs RdmaNics and PfcSwitches on a PhantoraFabric, configured by attributes.
#ifndef FABRIC_INSTALLER_H
#define FABRIC_INSTALLER_H

#include "phantora-fabric.h"

#include "ns3/attribute.h"
#include "ns3/object-factory.h"

#include <string>
#include <utility>
#include <vector>

namespace ns3 {

/**
 * Attribute `name` of `tid` parsed from `text`, checked before ns-3 parses it (some of its parsers
 * abort the process on bad text). Throws std::invalid_argument naming `what`.
 */
Ptr<AttributeValue> AttributeFromText(TypeId tid, const std::string& name, const std::string& text,
                                      const std::string& what);

/**
 * The fabric's device installer, part of the model (the facade builds every fabric with it; ns-3's direction is
 * model -> helper, so it is no helper): like ns-3's device helpers, attributes set here apply to every NIC,
 * switch or CC object made.
 * Install() creates an RdmaNic on every endpoint and a PfcSwitch on every switch of a fabric,
 * turns INT on where the fabric's IntMode (or its CC) asks for it, and wires each NIC to the
 * fabric's routes, its CC factory and the path queries of its CC.
 */
class FabricInstaller {
 public:
  FabricInstaller();

  /// Set an attribute of every RdmaNic (text checked now; throws std::invalid_argument).
  void SetNicAttribute(const std::string& name, const std::string& text);
  /// Set an attribute of every PfcSwitch (NVSwitches get NvSwitch = true on top).
  void SetSwitchAttribute(const std::string& name, const std::string& text);
  /// Set an attribute of every queue pair's CC object (checked at Install, against the fabric's CC type).
  void SetCcAttribute(const std::string& name, const std::string& text);

  /// Check the CC and its attributes, then install NICs and switches on every node of `fabric`.
  /// `dataComplete` / `senderDone` are told each flow's completion at its receiver / sender.
  void Install(Ptr<PhantoraFabric> fabric, RdmaNic::FlowCallback dataComplete, RdmaNic::FlowCallback senderDone);

  /// Whether the installed fabric stamps INT (valid after Install).
  bool IntEnabled() const { return m_intOn; }
  /// The factory of every queue pair's CC object, its attributes set (valid after Install).
  const ObjectFactory& CcFactory() const { return m_cc; }

 private:
  ObjectFactory m_nic;
  ObjectFactory m_switch;
  std::vector<std::pair<std::string, std::string>> m_ccAttributes;
  ObjectFactory m_cc;
  bool m_intOn = false;
};

}  // namespace ns3

#endif  // FABRIC_INSTALLER_H
