#include "wire/pcap.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace uroce::wire {
namespace {

using Bytes = std::vector<uint8_t>;

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

void WriteFile(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

Bytes ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// Builds a classic pcap file byte by byte, in either byte order, as another tool (tcpdump, dumpcap on a big-endian
// host) would have written it: independent of PcapWriter, so the reader is tested against the format, not itself.
class FileBuilder {
 public:
  FileBuilder(uint32_t link_type, bool big_endian, bool nanosecond) : big_endian_(big_endian) {
    Put32(nanosecond ? 0xA1B23C4D : 0xA1B2C3D4);
    Put16(2);
    Put16(4);
    Put32(0);
    Put32(0);
    Put32(65535);
    Put32(link_type);
  }
  FileBuilder& Record(uint32_t seconds, uint32_t fraction, const Bytes& frame, uint32_t original = 0) {
    Put32(seconds);
    Put32(fraction);
    Put32(static_cast<uint32_t>(frame.size()));
    Put32(original != 0 ? original : static_cast<uint32_t>(frame.size()));
    bytes_.insert(bytes_.end(), frame.begin(), frame.end());
    return *this;
  }
  const Bytes& bytes() const { return bytes_; }

 private:
  void Put16(uint16_t v) {
    if (big_endian_) {
      bytes_.push_back(v >> 8);
      bytes_.push_back(v & 0xFF);
    } else {
      bytes_.push_back(v & 0xFF);
      bytes_.push_back(v >> 8);
    }
  }
  void Put32(uint32_t v) {
    for (int i = 0; i < 4; ++i) {
      const int shift = big_endian_ ? 24 - 8 * i : 8 * i;
      bytes_.push_back((v >> shift) & 0xFF);
    }
  }
  bool big_endian_;
  Bytes bytes_;
};

// A minimal IPv4 header + 8 payload bytes (content irrelevant to the reader, which only uses version and length).
Bytes Ipv4Packet(uint8_t fill = 0xAB) {
  Bytes p(28, fill);
  p[0] = 0x45;
  p[1] = 0;
  p[2] = 0;
  p[3] = 28;  // total length
  return p;
}

Bytes Ipv6Packet() {
  Bytes p(48, 0xCD);
  p[0] = 0x60;
  p[4] = 0;
  p[5] = 8;  // payload length
  return p;
}

Bytes Concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Read {
  int rc;
  std::vector<PcapRecord> records;
  std::vector<Bytes> ip;  // copies, since record spans die at the next Next()
  std::string error;
};

Read ReadAll(const std::string& path) {
  Read out;
  PcapReader reader;
  out.rc = reader.Open(path);
  if (out.rc < 0) {
    out.error = reader.error();
    return out;
  }
  PcapRecord record;
  while ((out.rc = reader.Next(&record)) == 1) {
    out.ip.emplace_back(record.ip_packet.begin(), record.ip_packet.end());
    record.ip_packet = {};
    record.raw = {};
    out.records.push_back(record);
  }
  out.error = reader.error();
  return out;
}

Read ReadBytes(const std::string& name, const Bytes& bytes) {
  const std::string path = TempPath(name);
  WriteFile(path, bytes);
  return ReadAll(path);
}

TEST(PcapReader, ReadsAllFourMagicsWithTimestampsInNanoseconds) {
  for (bool big_endian : {false, true}) {
    for (bool nano : {false, true}) {
      SCOPED_TRACE(testing::Message() << "big_endian=" << big_endian << " nano=" << nano);
      FileBuilder file(101, big_endian, nano);
      file.Record(1700000000, nano ? 123456789 : 123456, Ipv4Packet());
      Read read = ReadBytes("magic.pcap", file.bytes());
      ASSERT_EQ(read.rc, 0) << read.error;
      ASSERT_EQ(read.records.size(), 1u);
      EXPECT_EQ(read.records[0].index, 1u);
      EXPECT_EQ(read.records[0].timestamp_ns, 1700000000ull * 1'000'000'000 + (nano ? 123456789 : 123456000));
      EXPECT_EQ(read.ip[0], Ipv4Packet());
      EXPECT_EQ(read.records[0].not_ip, "");
    }
  }
}

TEST(PcapReader, StripsEveryLinkHeader) {
  const Bytes ip = Ipv4Packet();
  const Bytes macs = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  struct Case {
    const char* name;
    uint32_t link_type;
    Bytes frame;
    Bytes want;
  };
  const std::vector<Case> cases = {
      {"raw", 101, ip, ip},
      {"raw6", 101, Ipv6Packet(), Ipv6Packet()},
      {"ipv4", 228, ip, ip},
      {"ipv6", 229, Ipv6Packet(), Ipv6Packet()},
      {"ethernet", 1, Concat(Concat(macs, {0x08, 0x00}), ip), ip},
      {"ethernet6", 1, Concat(Concat(macs, {0x86, 0xDD}), Ipv6Packet()), Ipv6Packet()},
      // 802.1Q tag (TPID 0x8100, TCI with VLAN 100), then IPv4.
      {"vlan", 1, Concat(Concat(macs, {0x81, 0x00, 0x00, 0x64, 0x08, 0x00}), ip), ip},
      // QinQ: 802.1ad S-tag, then 802.1Q C-tag.
      {"qinq", 1, Concat(Concat(macs, {0x88, 0xA8, 0x00, 0x0A, 0x81, 0x00, 0x00, 0x64, 0x86, 0xDD}), Ipv6Packet()),
       Ipv6Packet()},
      // Ethernet minimum-size padding and FCS after the IP packet are cut off by the IP total length.
      {"padding", 1, Concat(Concat(Concat(macs, {0x08, 0x00}), ip), Bytes(22, 0xEE)), ip},
      // SLL: packet type 0 (to us), ARPHRD_LOOPBACK 772, address length 6, 8 address bytes, protocol 0x0800.
      {"sll", 113, Concat({0, 0, 0x03, 0x04, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0, 0x08, 0x00}, ip), ip},
      // SLL2: protocol 0x86DD, reserved, ifindex 1, ARPHRD_ETHER, packet type, address length, 8 address bytes.
      {"sll2", 276, Concat({0x86, 0xDD, 0, 0, 0, 0, 0, 1, 0, 1, 0, 6, 1, 2, 3, 4, 5, 6, 0, 0}, Ipv6Packet()),
       Ipv6Packet()},
      {"null_le", 0, Concat({2, 0, 0, 0}, ip), ip},
      {"null_be", 0, Concat({0, 0, 0, 30}, Ipv6Packet()), Ipv6Packet()},
      {"loop", 108, Concat({0, 0, 0, 2}, ip), ip},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FileBuilder file(c.link_type, /*big_endian=*/c.link_type == 113, /*nanosecond=*/false);
    file.Record(1, 2, c.frame);
    Read read = ReadBytes(std::string(c.name) + ".pcap", file.bytes());
    ASSERT_EQ(read.rc, 0) << read.error;
    ASSERT_EQ(read.records.size(), 1u);
    EXPECT_EQ(read.records[0].not_ip, "");
    EXPECT_EQ(read.ip[0], c.want);
  }
}

TEST(PcapReader, SaysWhyARecordIsNotIp) {
  const Bytes macs(12, 0x11);
  struct Case {
    uint32_t link_type;
    Bytes frame;
    const char* want;
    bool malformed;
  };
  const std::vector<Case> cases = {
      {1, Concat(macs, {0x89, 0x15, 1, 2, 3}), "EtherType 0x8915 (RoCEv1) is not IP", false},
      {1, Concat(macs, {0x08, 0x06, 1, 2, 3}), "EtherType 0x0806 is not IP", false},
      {1, Bytes(10, 0), "frame too short for an Ethernet header (10 bytes)", true},
      {1, Concat(macs, {0x81, 0x00, 0x00}), "frame too short for a VLAN tag (15 bytes)", true},
      {113, Bytes(15, 0), "frame too short for a Linux cooked (SLL) header (15 bytes)", true},
      {276, Bytes(19, 0), "frame too short for a Linux cooked (SLL2) header (19 bytes)", true},
      {101, {0x15, 0, 0}, "IP version 1 is neither 4 nor 6", true},
      {101, {}, "empty packet", true},
      {228, Ipv6Packet(), "LINKTYPE_IPV4 record is not IPv4", true},
      {0, {7, 0, 0, 0, 0x45}, "loopback address family 7 is not IP", false},
      {147, Ipv4Packet(), "unsupported link type 147", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.want);
    FileBuilder file(c.link_type, false, true);
    file.Record(1, 2, c.frame);
    Read read = ReadBytes("notip.pcap", file.bytes());
    ASSERT_EQ(read.rc, 0) << read.error;
    ASSERT_EQ(read.records.size(), 1u);
    EXPECT_EQ(read.records[0].not_ip, c.want);
    EXPECT_EQ(read.records[0].malformed, c.malformed);
    EXPECT_TRUE(read.ip[0].empty());
  }
}

TEST(PcapReader, ReportsSnaplenTruncation) {
  FileBuilder file(101, false, true);
  Bytes cut = Ipv4Packet();
  cut.resize(20);
  file.Record(5, 6, cut, /*original=*/1500);
  Read read = ReadBytes("snap.pcap", file.bytes());
  ASSERT_EQ(read.rc, 0) << read.error;
  ASSERT_EQ(read.records.size(), 1u);
  EXPECT_TRUE(read.records[0].truncated);
  EXPECT_EQ(read.records[0].original_length, 1500u);
  EXPECT_EQ(read.ip[0], cut);  // Left whole for the IP parser to reject.
}

TEST(PcapReader, RejectsPcapngAndJunkWithAReason) {
  Read ng = ReadBytes("x.pcapng", {0x0A, 0x0D, 0x0D, 0x0A, 0x1C, 0, 0, 0, 0x4D, 0x3C, 0x2B, 0x1A, 1, 0, 0, 0, 0, 0,
                                   0, 0, 0, 0, 0, 0});
  EXPECT_EQ(ng.rc, -EPROTONOSUPPORT);
  EXPECT_NE(ng.error.find("pcapng is not supported"), std::string::npos) << ng.error;

  Read junk = ReadBytes("junk.pcap", Bytes(100, 'x'));
  EXPECT_EQ(junk.rc, -EPROTONOSUPPORT);
  EXPECT_EQ(junk.error, "not a pcap file (magic number 0x78787878)");

  Read short_header = ReadBytes("short.pcap", {0xD4, 0xC3, 0xB2, 0xA1, 2, 0});
  EXPECT_EQ(short_header.rc, -EBADMSG);
  EXPECT_EQ(short_header.error, "file too short for a pcap header (6 of 24 bytes)");

  Read empty = ReadBytes("empty.pcap", {});
  EXPECT_EQ(empty.rc, -EBADMSG);

  FileBuilder v1(101, false, false);
  Bytes version1 = v1.bytes();
  version1[4] = 1;
  EXPECT_EQ(ReadBytes("v1.pcap", version1).rc, -EPROTONOSUPPORT);

  Read missing = ReadAll(TempPath("does-not-exist.pcap"));
  EXPECT_EQ(missing.rc, -ENOENT);
}

TEST(PcapReader, ReportsAFileCutShortAfterTheGoodRecords) {
  FileBuilder file(101, false, true);
  file.Record(1, 0, Ipv4Packet(1)).Record(2, 0, Ipv4Packet(2));
  const Bytes whole = file.bytes();

  Bytes in_body(whole.begin(), whole.end() - 5);
  Read read = ReadBytes("cut_body.pcap", in_body);
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_EQ(read.records.size(), 1u);
  EXPECT_EQ(read.error, "record 2: file cut short inside the packet (23 of 28 bytes)");

  Bytes in_header(whole.begin(), whole.begin() + 24 + 16 + 28 + 7);
  read = ReadBytes("cut_header.pcap", in_header);
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_EQ(read.records.size(), 1u);
  EXPECT_EQ(read.error, "record 2: file cut short inside the record header (7 of 16 bytes)");
}

TEST(PcapReader, RefusesAnAbsurdRecordLengthWithoutAllocatingIt) {
  FileBuilder file(101, false, true);
  Bytes bytes = file.bytes();
  for (uint8_t b : {1, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0x7F, 0xFF, 0xFF, 0xFF, 0x7F}) bytes.push_back(b);
  Read read = ReadBytes("absurd.pcap", bytes);
  EXPECT_EQ(read.rc, -EBADMSG);
  EXPECT_NE(read.error.find("record 1: captured length 2147483647"), std::string::npos) << read.error;
}

// Every prefix of a valid file, and the file with each byte flipped, is read without a crash (ASan checks the
// bounds): each run ends in 0 or a negative error, never out of bounds.
TEST(PcapReader, SurvivesEveryPrefixAndByteFlip) {
  FileBuilder file(1, false, true);
  file.Record(1, 0, Concat(Bytes(12, 0x22), Concat({0x81, 0x00, 0, 5, 0x08, 0x00}, Ipv4Packet())));
  file.Record(2, 0, Concat(Bytes(12, 0x22), Concat({0x86, 0xDD}, Ipv6Packet())));
  const Bytes whole = file.bytes();
  for (size_t n = 0; n <= whole.size(); ++n) {
    Read read = ReadBytes("prefix.pcap", Bytes(whole.begin(), whole.begin() + n));
    EXPECT_LE(read.rc, 0);
  }
  for (size_t i = 0; i < whole.size(); ++i) {
    Bytes flipped = whole;
    flipped[i] ^= 0xFF;
    Read read = ReadBytes("flip.pcap", flipped);
    EXPECT_LE(read.rc, 0);
  }
}

TEST(PcapWriter, WritesANanosecondRawFileTheReaderReadsBack) {
  const std::string path = TempPath("writer_raw.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  EXPECT_EQ(writer.Open(path), -EBUSY);
  ASSERT_EQ(writer.Write(1'700'000'000'123'456'789ull, Ipv4Packet(1)), 0);
  ASSERT_EQ(writer.Write(5, Ipv6Packet()), 0);
  EXPECT_EQ(writer.Write(6, {}), -EINVAL);
  EXPECT_EQ(writer.records_written(), 2u);
  ASSERT_EQ(writer.Close(), 0);
  EXPECT_EQ(writer.Close(), 0);
  EXPECT_EQ(writer.Write(7, Ipv4Packet()), -EBADF);

  // The file header as pcap-savefile(5) lays it out, in this (little-endian) host's order.
  const Bytes bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 24u);
  EXPECT_EQ(Bytes(bytes.begin(), bytes.begin() + 8), (Bytes{0x4D, 0x3C, 0xB2, 0xA1, 2, 0, 4, 0}));
  EXPECT_EQ(Bytes(bytes.begin() + 20, bytes.begin() + 24), (Bytes{101, 0, 0, 0}));

  PcapReader reader;
  ASSERT_EQ(reader.Open(path), 0);
  EXPECT_TRUE(reader.nanosecond());
  EXPECT_EQ(reader.link_type(), 101u);
  PcapRecord record;
  ASSERT_EQ(reader.Next(&record), 1);
  EXPECT_EQ(record.timestamp_ns, 1'700'000'000'123'456'789ull);
  EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv4Packet(1));
  ASSERT_EQ(reader.Next(&record), 1);
  EXPECT_EQ(record.index, 2u);
  EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Ipv6Packet());
  EXPECT_EQ(reader.Next(&record), 0);
  EXPECT_EQ(reader.Next(&record), 0);
}

TEST(PcapWriter, EthernetLinkTypeAndSnaplen) {
  const std::string path = TempPath("writer_eth.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path, {.link_type = PcapLinkType::kEthernet, .snaplen = 30}), 0);
  ASSERT_EQ(writer.Write(1, Ipv4Packet()), 0);     // 14 + 28 = 42 on the wire, 30 captured
  EXPECT_EQ(writer.Write(2, Bytes{0x15, 0}), -EINVAL);  // not IP: no EtherType to give it
  ASSERT_EQ(writer.Close(), 0);

  PcapReader reader;
  ASSERT_EQ(reader.Open(path), 0);
  EXPECT_EQ(reader.link_type(), 1u);
  EXPECT_EQ(reader.snaplen(), 30u);
  PcapRecord record;
  ASSERT_EQ(reader.Next(&record), 1);
  EXPECT_TRUE(record.truncated);
  EXPECT_EQ(record.original_length, 42u);
  EXPECT_EQ(record.raw.size(), 30u);
  EXPECT_EQ(record.raw[12], 0x08);
  EXPECT_EQ(record.raw[13], 0x00);
  const Bytes ip = Ipv4Packet();
  EXPECT_EQ(Bytes(record.ip_packet.begin(), record.ip_packet.end()), Bytes(ip.begin(), ip.begin() + 16));
  EXPECT_EQ(reader.Next(&record), 0);
}

TEST(PcapWriter, RejectsBadOptionsAndUnwritablePaths) {
  PcapWriter writer;
  EXPECT_EQ(writer.Open(TempPath("bad.pcap"), {.link_type = PcapLinkType::kLinuxSll2}), -EINVAL);
  EXPECT_EQ(writer.Open(TempPath("bad.pcap"), {.snaplen = 0}), -EINVAL);
  EXPECT_EQ(writer.Open(TempPath("no/such/dir/x.pcap")), -ENOENT);
  EXPECT_FALSE(writer.is_open());
}

TEST(PcapWriter, ConcurrentWritersNeverInterleaveRecords) {
  const std::string path = TempPath("writer_threads.pcap");
  PcapWriter writer;
  ASSERT_EQ(writer.Open(path), 0);
  constexpr int kThreads = 4;
  constexpr int kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&writer, t] {
      for (int i = 0; i < kPerThread; ++i) {
        Bytes packet = Ipv4Packet(static_cast<uint8_t>(t + 1));
        packet[4] = static_cast<uint8_t>(i);
        ASSERT_EQ(writer.Write(static_cast<uint64_t>(i), packet), 0);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(writer.Close(), 0);

  Read read = ReadAll(path);
  ASSERT_EQ(read.rc, 0) << read.error;
  ASSERT_EQ(read.records.size(), size_t{kThreads * kPerThread});
  std::vector<int> per_thread(kThreads + 1, 0);
  for (const Bytes& ip : read.ip) {
    ASSERT_EQ(ip.size(), 28u);
    const uint8_t t = ip[27];
    ASSERT_GE(t, 1);
    ASSERT_LE(t, kThreads);
    EXPECT_EQ(ip[4], static_cast<uint8_t>(per_thread[t]));  // each thread's records in its own order
    ++per_thread[t];
  }
}

}  // namespace
}  // namespace uroce::wire
