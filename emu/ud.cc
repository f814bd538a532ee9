// The UD transport (ud.h): one-packet SENDs out, Q_Key-checked datagrams in, with the sender's IP header in the GRH
// slot.
#include "emu/ud.h"

#include <cstring>
#include <vector>

#include "emu/device_core.h"
#include "emu/out_batch.h"
#include "emu/queue_pair.h"
#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/opcode.h"

namespace uroce::emu {
namespace {

// RoCEv2 places the IP header of a received UD datagram in the 40-byte GRH slot at the head of the receive buffer;
// for IPv4 the 20-byte header fills the slot's last 20 bytes (rdma-core's ibv_init_ah_from_wc reads it there).
constexpr size_t kGrhSize = 40;

void BuildGrh(const wire::InDatagram& d, size_t payload_len, uint8_t grh[kGrhSize]) {
  std::memset(grh, 0, kGrhSize);
  wire::Flow flow{d.src, d.dst, d.ip_id.value_or(0)};
  const bool v6 = !d.src.addr.is_v4();
  // An IP header of the right length, addresses and (for IPv4) a valid checksum; the UDP header that
  // BuildIpUdpFrame appends after it is not copied.
  std::vector<uint8_t> frame(wire::IpUdpFrameLength(v6, 0));
  wire::BuildIpUdpFrame(flow, {}, frame);
  if (v6) {
    std::memcpy(grh, frame.data(), 40);
    wire::StoreBe16(grh + 4, static_cast<uint16_t>(payload_len));
  } else {
    std::memcpy(grh + 20, frame.data(), 20);
  }
}

// What a RoCEv2 UD receive reports in wc.sl: the L3 header type of the packet, 2 for IPv4 and 1 for IPv6. IBTA
// annex A17.4.5.1 says a RoCEv2 UD completion carries a flag telling the two apart and ibv_wc has no field for it;
// mlx5 (its PRM's L3_Header_Type) and hns put it in sl, and UCX's ud_verbs (up to 1.18) reads it there to find the
// GID in the GRH area; an InfiniBand SL has no meaning on RoCE.
uint8_t RoceL3HeaderType(const wire::IpAddress& src) { return src.is_v4() ? 2 : 1; }

}  // namespace

int UdTransport::Post(SendWr& wr, OutBatch& out) {
  if (!ValidOn(FindSendOpcode(wr.opcode), QpType::kUd)) return EINVAL;  // UD carries SENDs only (IBTA table 38)
  if (wr.ah == nullptr || wr.ah->pd() != qp_.init().pd) return EINVAL;
  const wire::IpAddress peer = wr.ah->destination();
  int err = 0;
  if (core_.HoldUnreliableSend(qp_, wr, peer, &err)) return err;
  Send(wr, peer, out);
  return 0;
}

void UdTransport::Send(const SendWr& wr, const wire::IpAddress& peer, OutBatch& out) {
  std::vector<uint8_t> payload;
  WcStatus st = core_.Gather(qp_, wr, payload);
  if (st == WcStatus::kSuccess && payload.size() > MtuBytes(core_.config.active_mtu)) st = WcStatus::kLocLenErr;
  if (st != WcStatus::kSuccess) {
    core_.FailUnreliableSend(qp_, wr, st);
    return;
  }
  wire::PacketSpec spec;
  // UD defines SEND ONLY, with and without immediate (IBTA table 38); the opcode check above lets nothing else through.
  spec.bth.opcode = *wire::MessageOpcode(wire::TransportKind::kUd, wire::Operation::kSend, wire::MsgPosition::kOnly,
                                         FindSendOpcode(wr.opcode)->immediate);
  spec.bth.solicited = wr.flags & send_flags::kSolicited;
  spec.bth.dest_qp = wr.remote_qpn;
  spec.bth.psn = qp_.NextSendPsn();
  // IBTA 10.2.4: a Q_Key with the high-order bit set means "use the QP's own Q_Key".
  const uint32_t qkey = (wr.remote_qkey & 0x80000000u) ? qp_.attributes().qkey : wr.remote_qkey;
  spec.deth = wire::Deth{qkey, 0, qp_.qpn()};
  spec.imm = wire::ImmDt{wr.imm_data};
  const wire::UdpEndpoint dst{peer, wire::kRoceV2UdpPort};
  out.Add(core_.transport, spec, payload, core_.SourceOf(wr.ah->av()), dst, wire::RoceSourcePort(qp_.qpn(), wr.remote_qpn));
  core_.ChargeUnreliable(peer, payload.size());
  core_.CompleteSend(qp_, wr, WcStatus::kSuccess);
}

void UdTransport::Receive(const wire::InDatagram& d, const wire::PacketView& p) {
  if (!p.deth || p.deth->qkey != qp_.attributes().qkey) {
    core_.Count(&DeviceCounters::rx_bad_qkey);  // IBTA 10.2.4 (C10-15): Q_Key mismatch, silently dropped
    return;
  }
  std::optional<RecvWr> taken = core_.TakeReceiveWqe(qp_);  // the QP's own queue or its SRQ
  if (!taken) {
    core_.Count(&DeviceCounters::rx_no_receive_wqe);  // UD has no RNR: the datagram is lost (IBTA 9.7.8)
    return;
  }
  RecvWr rqe = std::move(*taken);
  Completion c;
  c.wr_id = rqe.wr_id;
  c.opcode = WcOpcode::kRecv;
  c.qp_num = qp_.qpn();
  c.src_qp = p.deth->src_qp;
  c.byte_len = static_cast<uint32_t>(kGrhSize + p.payload.size());
  c.wc_flags = wc_flags::kGrh;
  c.sl = RoceL3HeaderType(d.src.addr);
  c.solicited = p.bth.solicited;
  if (p.imm) {
    c.imm_data = p.imm->imm;
    c.wc_flags |= wc_flags::kWithImm;
  }
  uint8_t grh[kGrhSize];
  BuildGrh(d, p.payload.size(), grh);
  c.status = core_.Scatter(qp_, rqe.sg_list, 0, grh);
  if (c.status == WcStatus::kSuccess) c.status = core_.Scatter(qp_, rqe.sg_list, kGrhSize, p.payload);
  core_.Complete(qp_.init().recv_cq, c);
  core_.KeepSrqWqe(qp_, std::move(rqe));
  if (c.status != WcStatus::kSuccess) core_.EnterError(qp_);
}

}  // namespace uroce::emu
