// RCCC, the Ultra Ethernet receiver-credit congestion control (UEC specification 1.0; htsim's uet-htsim, read to
// learn it, runs it as -receiver_cc_only). The sender has no window and no rate of its own: it paces at line rate
// and sends only against credit. Each data packet asks its receiver for a cumulative grant (enough for what is
// left to send, up to MaxCredit BDPs ahead of what was sent); each receiving NIC port hands credit out in turn
// to the messages that asked, a quantum at a time, paced at the port's rate (RdmaNic attributes CreditRate,
// CreditQuantum), so an incast's senders share the port without a standing queue once the first round trip is
// over. Before its first grant or ACK a message may send SpeculativeCredit BDPs. A trimmed packet's NACK also
// adds its bytes to the receiver's grant (the resend needs credit). The ledger and the pacer are in
// uet-credit.h; with NSCC too, `--cc nscc --set cc.ReceiverCredit=true`.
#include "congestion-control.h"
#include "phantora-type-id.h"

#include "ns3/log.h"

namespace ns3 {

/// Receiver credits only: line rate, no window.
class CcRccc : public CongestionControl {
 public:
  static TypeId GetTypeId();
  void OnAck(const CcFeedback& fb) override {}
};

NS_LOG_COMPONENT_DEFINE("PhantoraCcRccc");
PHANTORA_REGISTER_CC(CcRccc, "rccc");

TypeId CcRccc::GetTypeId() {
  static TypeId tid = AddCreditAttributes(PhantoraTypeId<CcRccc, CongestionControl>("ns3::CcRccc"), true);
  return tid;
}

}  // namespace ns3
