// The TypeId every phantora model class starts from.
#ifndef PHANTORA_TYPE_ID_H
#define PHANTORA_TYPE_ID_H

#include "ns3/type-id.h"

#include <string>

namespace ns3 {

/// TypeId `name` of class T: parent Parent, group "Phantora", a default constructor. T::GetTypeId()
/// adds its attributes and trace sources to it.
template <typename T, typename Parent>
TypeId PhantoraTypeId(const std::string& name) {
  return TypeId(name).SetParent<Parent>().SetGroupName("Phantora").template AddConstructor<T>();
}

}  // namespace ns3

#endif  // PHANTORA_TYPE_ID_H
