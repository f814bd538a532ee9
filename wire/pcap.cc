#include "wire/pcap.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace uroce::wire {
namespace {

// File header magic numbers as read in the writer's byte order (pcap-savefile(5)).
constexpr uint32_t kMagicMicro = 0xA1B2C3D4;
constexpr uint32_t kMagicNano = 0xA1B23C4D;
constexpr size_t kFileHeaderSize = 24;
constexpr size_t kRecordHeaderSize = 16;
// No real link carries a frame this long; a larger incl_len means the file is corrupt, and refusing it keeps a
// corrupt length from turning into a huge allocation.
constexpr uint32_t kMaxRecordSize = 16u << 20;

// pcapng (draft-ietf-opsawg-pcapng): block types, the Section Header Block's byte-order magic, option codes.
constexpr uint32_t kBlockSectionHeader = 0x0A0D0D0A;  // A palindrome: the same in both byte orders.
constexpr uint32_t kBlockInterface = 1;
constexpr uint32_t kBlockSimplePacket = 3;
constexpr uint32_t kBlockEnhancedPacket = 6;
constexpr uint32_t kByteOrderMagic = 0x1A2B3C4D;
constexpr uint16_t kOptEnd = 0;
constexpr uint16_t kOptIfTsresol = 9;
constexpr uint16_t kOptIfTsoffset = 14;
constexpr uint16_t kPcapngMajor = 1;
// Block type, total length ... total length again.
constexpr size_t kBlockOverhead = 12;
// A packet block holds one record plus its fixed fields and options; anything longer is corrupt.
constexpr uint32_t kMaxBlockSize = kMaxRecordSize + (64u << 10);

constexpr uint16_t kEtherTypeIpv4 = 0x0800;
constexpr uint16_t kEtherTypeIpv6 = 0x86DD;
constexpr uint16_t kEtherTypeVlan = 0x8100;    // IEEE 802.1Q C-tag.
constexpr uint16_t kEtherTypeQinQ = 0x88A8;    // IEEE 802.1ad S-tag.
constexpr uint16_t kEtherTypeQinQOld = 0x9100; // Pre-standard double tagging.
constexpr uint16_t kEtherTypeRoceV1 = 0x8915;

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[3]} | uint32_t{p[2]} << 8 | uint32_t{p[1]} << 16 | uint32_t{p[0]} << 24;
}

void PutNative32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutNative16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }

int WriteAll(int fd, const iovec* iov_in, int count) {
  iovec iov[4];
  std::memcpy(iov, iov_in, sizeof(iovec) * count);
  int first = 0;
  while (first < count) {
    ssize_t n = ::writev(fd, iov + first, count - first);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    size_t left = static_cast<size_t>(n);
    while (first < count && left >= iov[first].iov_len) {
      left -= iov[first].iov_len;
      ++first;
    }
    if (first < count) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + left;
      iov[first].iov_len -= left;
    }
  }
  return 0;
}

// The IP packet at the start of `bytes`, cut to its own length field when the frame has bytes after it (Ethernet
// pads frames to 60 bytes and may carry an FCS). Left whole when truncated or when the length field is 0 (IPv4 TSO
// captures, IPv6 jumbograms), so the IP parser can say what is wrong.
std::span<const uint8_t> TrimToIpLength(std::span<const uint8_t> bytes, std::string* why_not, bool* malformed) {
  if (bytes.empty()) {
    *malformed = true;
    *why_not = "empty packet";
    return {};
  }
  const uint8_t version = bytes[0] >> 4;
  size_t length = 0;
  if (version == 4) {
    if (bytes.size() >= 4) length = Be16(bytes.data() + 2);
  } else if (version == 6) {
    if (bytes.size() >= 6) length = size_t{40} + Be16(bytes.data() + 4);
  } else {
    *malformed = true;
    *why_not = "IP version " + std::to_string(version) + " is neither 4 nor 6";
    return {};
  }
  if (length != 0 && length < bytes.size()) bytes = bytes.first(length);
  return bytes;
}

std::span<const uint8_t> ByEtherType(uint16_t ether_type, std::span<const uint8_t> rest, std::string* why_not,
                                     bool* malformed) {
  if (ether_type == kEtherTypeIpv4 || ether_type == kEtherTypeIpv6) return TrimToIpLength(rest, why_not, malformed);
  char text[64];
  std::snprintf(text, sizeof text, "EtherType 0x%04x%s is not IP", ether_type,
                ether_type == kEtherTypeRoceV1 ? " (RoCEv1)" : "");
  *why_not = text;
  return {};
}

// BSD loopback address families meaning IPv6: 24 (NetBSD, OpenBSD), 28 (FreeBSD), 30 (macOS); Linux's AF_INET6 is 10.
bool IsIpv6Family(uint32_t family) { return family == 10 || family == 24 || family == 28 || family == 30; }

}  // namespace

std::string PcapLinkTypeName(uint32_t link_type) {
  switch (static_cast<PcapLinkType>(link_type)) {
    case PcapLinkType::kNull: return "NULL";
    case PcapLinkType::kEthernet: return "ETHERNET";
    case PcapLinkType::kRaw: return "RAW";
    case PcapLinkType::kLoop: return "LOOP";
    case PcapLinkType::kLinuxSll: return "LINUX_SLL";
    case PcapLinkType::kIpv4: return "IPV4";
    case PcapLinkType::kIpv6: return "IPV6";
    case PcapLinkType::kLinuxSll2: return "LINUX_SLL2";
  }
  return std::to_string(link_type);
}

std::span<const uint8_t> PcapExtractIpPacket(uint32_t link_type, std::span<const uint8_t> frame,
                                             std::string* why_not, bool* malformed_out) {
  why_not->clear();
  bool ignored = false;
  bool* malformed = malformed_out != nullptr ? malformed_out : &ignored;
  *malformed = false;
  auto too_short = [&](const char* what) {
    *malformed = true;
    *why_not = std::string("frame too short for ") + what + " (" + std::to_string(frame.size()) + " bytes)";
    return std::span<const uint8_t>();
  };
  switch (static_cast<PcapLinkType>(link_type)) {
    case PcapLinkType::kRaw:
      return TrimToIpLength(frame, why_not, malformed);
    case PcapLinkType::kIpv4:
      if (!frame.empty() && frame[0] >> 4 != 4) {
        *malformed = true;
        *why_not = "LINKTYPE_IPV4 record is not IPv4";
        return {};
      }
      return TrimToIpLength(frame, why_not, malformed);
    case PcapLinkType::kIpv6:
      if (!frame.empty() && frame[0] >> 4 != 6) {
        *malformed = true;
        *why_not = "LINKTYPE_IPV6 record is not IPv6";
        return {};
      }
      return TrimToIpLength(frame, why_not, malformed);
    case PcapLinkType::kEthernet: {
      // Ethernet II: destination MAC, source MAC, EtherType; then any number of VLAN tags (TCI + next EtherType).
      if (frame.size() < 14) return too_short("an Ethernet header");
      size_t offset = 12;
      uint16_t ether_type = Be16(frame.data() + offset);
      offset += 2;
      while (ether_type == kEtherTypeVlan || ether_type == kEtherTypeQinQ || ether_type == kEtherTypeQinQOld) {
        if (frame.size() < offset + 4) return too_short("a VLAN tag");
        ether_type = Be16(frame.data() + offset + 2);
        offset += 4;
      }
      if (ether_type < 0x0600) {
        *why_not = "IEEE 802.3 length field, not an EtherType: not IP";
        return {};
      }
      return ByEtherType(ether_type, frame.subspan(offset), why_not, malformed);
    }
    case PcapLinkType::kLinuxSll:
      // packet type(2) ARPHRD type(2) address length(2) address(8) protocol(2), see pcap-linktype(7) LINUX_SLL.
      if (frame.size() < 16) return too_short("a Linux cooked (SLL) header");
      return ByEtherType(Be16(frame.data() + 14), frame.subspan(16), why_not, malformed);
    case PcapLinkType::kLinuxSll2:
      // protocol(2) reserved(2) interface index(4) ARPHRD type(2) packet type(1) address length(1) address(8).
      if (frame.size() < 20) return too_short("a Linux cooked (SLL2) header");
      return ByEtherType(Be16(frame.data()), frame.subspan(20), why_not, malformed);
    case PcapLinkType::kNull:
    case PcapLinkType::kLoop: {
      if (frame.size() < 4) return too_short("a loopback header");
      // NULL stores the family in the capturing host's byte order, which the file does not record: a family is a
      // small number, so whichever reading is small is the right one.
      uint32_t family = link_type == uint32_t(PcapLinkType::kLoop) ? Be32(frame.data()) : Le32(frame.data());
      if (family > 0xFFFF) family = Be32(frame.data());
      if (family == 2) return TrimToIpLength(frame.subspan(4), why_not, malformed);
      if (IsIpv6Family(family)) return TrimToIpLength(frame.subspan(4), why_not, malformed);
      *why_not = "loopback address family " + std::to_string(family) + " is not IP";
      return {};
    }
  }
  *why_not = "unsupported link type " + std::to_string(link_type);
  return {};
}

// ---------------------------------------------------------------------------------------------------------------
// PcapWriter

PcapWriter::~PcapWriter() { Close(); }

int PcapWriter::Open(const std::string& path, const PcapWriterOptions& options) {
  std::lock_guard lock(mu_);
  if (fd_ >= 0) return -EBUSY;
  if (options.link_type != PcapLinkType::kRaw && options.link_type != PcapLinkType::kEthernet) return -EINVAL;
  if (options.snaplen == 0) return -EINVAL;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  // File header in this host's byte order, as libpcap writes it: the magic tells a reader which order that was.
  uint8_t header[kFileHeaderSize] = {};
  PutNative32(header + 0, kMagicNano);
  PutNative16(header + 4, 2);  // version 2.4
  PutNative16(header + 6, 4);
  // bytes 8..15: thiszone and sigfigs, both 0.
  PutNative32(header + 16, options.snaplen);
  PutNative32(header + 20, static_cast<uint32_t>(options.link_type));
  iovec iov{header, sizeof header};
  if (int err = WriteAll(fd, &iov, 1); err < 0) {
    ::close(fd);
    return err;
  }
  fd_ = fd;
  options_ = options;
  records_ = 0;
  return 0;
}

int PcapWriter::Write(uint64_t timestamp_ns, std::span<const uint8_t> ip_packet) {
  if (ip_packet.empty()) return -EINVAL;
  std::lock_guard lock(mu_);
  if (fd_ < 0) return -EBADF;
  uint8_t ethernet[14] = {
      0x02, 0, 0, 0, 0, 0x02,  // destination: locally administered, unicast
      0x02, 0, 0, 0, 0, 0x01,  // source
      0, 0,                    // EtherType, below
  };
  const bool with_ethernet = options_.link_type == PcapLinkType::kEthernet;
  if (with_ethernet) {
    const uint8_t version = ip_packet[0] >> 4;
    if (version != 4 && version != 6) return -EINVAL;
    const uint16_t ether_type = version == 4 ? kEtherTypeIpv4 : kEtherTypeIpv6;
    ethernet[12] = ether_type >> 8;
    ethernet[13] = ether_type & 0xFF;
  }
  const size_t link_len = with_ethernet ? sizeof ethernet : 0;
  const size_t original = link_len + ip_packet.size();
  if (original > UINT32_MAX) return -EMSGSIZE;
  const size_t included = std::min<size_t>(original, options_.snaplen);

  uint8_t record[kRecordHeaderSize];
  PutNative32(record + 0, static_cast<uint32_t>(timestamp_ns / 1'000'000'000));
  PutNative32(record + 4, static_cast<uint32_t>(timestamp_ns % 1'000'000'000));
  PutNative32(record + 8, static_cast<uint32_t>(included));
  PutNative32(record + 12, static_cast<uint32_t>(original));

  iovec iov[3];
  int count = 0;
  iov[count++] = {record, sizeof record};
  size_t budget = included;
  if (with_ethernet) {
    const size_t n = std::min(budget, sizeof ethernet);
    iov[count++] = {ethernet, n};
    budget -= n;
  }
  if (budget > 0) {
    iov[count++] = {const_cast<uint8_t*>(ip_packet.data()), std::min(budget, ip_packet.size())};
  }

  if (int err = WriteAll(fd_, iov, count); err < 0) return err;
  ++records_;
  return 0;
}

int PcapWriter::Close() {
  std::lock_guard lock(mu_);
  if (fd_ < 0) return 0;
  int rc = ::close(fd_) == 0 ? 0 : -errno;
  fd_ = -1;
  return rc;
}

bool PcapWriter::is_open() const {
  std::lock_guard lock(mu_);
  return fd_ >= 0;
}

uint64_t PcapWriter::records_written() const {
  std::lock_guard lock(mu_);
  return records_;
}

// ---------------------------------------------------------------------------------------------------------------
// PcapReader

PcapReader::~PcapReader() {
  if (file_ != nullptr && owns_file_) std::fclose(file_);
}

int PcapReader::Fail(int err, std::string message) {
  error_ = std::move(message);
  sticky_error_ = err;
  return err;
}

uint32_t PcapReader::U32(const uint8_t* p) const {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return swapped_ ? __builtin_bswap32(v) : v;
}

int PcapReader::Open(const std::string& path) {
  if (file_ != nullptr) return -EBUSY;
  if (path == "-") {
    file_ = stdin;
    owns_file_ = false;
  } else {
    file_ = std::fopen(path.c_str(), "rbe");
    if (file_ == nullptr) {
      const int err = errno;
      return Fail(-err, path + ": " + std::strerror(err));
    }
    owns_file_ = true;
  }
  uint8_t header[kFileHeaderSize];
  size_t got = std::fread(header, 1, 4, file_);
  if (got == 4) {
    uint32_t magic;
    std::memcpy(&magic, header, 4);
    if (magic == kBlockSectionHeader) return OpenPcapng();
    got += std::fread(header + 4, 1, sizeof header - 4, file_);
    if (magic == kMagicMicro || magic == kMagicNano) {
      swapped_ = false;
    } else if (magic == __builtin_bswap32(kMagicMicro) || magic == __builtin_bswap32(kMagicNano)) {
      swapped_ = true;
      magic = __builtin_bswap32(magic);
    } else {
      char text[96];
      std::snprintf(text, sizeof text, "not a pcap file (magic number 0x%08x)", magic);
      return Fail(-EPROTONOSUPPORT, text);
    }
    nanosecond_ = magic == kMagicNano;
  }
  if (got < sizeof header) {
    if (std::ferror(file_)) return Fail(-EIO, "read error in the pcap file header");
    return Fail(-EBADMSG, "file too short for a pcap header (" + std::to_string(got) + " of 24 bytes)");
  }
  uint16_t major, minor;
  std::memcpy(&major, header + 4, 2);
  std::memcpy(&minor, header + 6, 2);
  if (swapped_) {
    major = __builtin_bswap16(major);
    minor = __builtin_bswap16(minor);
  }
  if (major != 2) {
    return Fail(-EPROTONOSUPPORT,
                "unsupported pcap version " + std::to_string(major) + "." + std::to_string(minor));
  }
  snaplen_ = U32(header + 16);
  // The upper bits carry FCS information (pcap-savefile(5)); the link type is the low 16 bits. A trailing FCS is
  // cut off with the rest of the link-layer trailer by the IP length field, so the FCS length is not needed.
  link_type_ = U32(header + 20) & 0xFFFF;
  return 0;
}

int PcapReader::Next(PcapRecord* record) {
  if (sticky_error_ != 0) return sticky_error_;
  if (file_ == nullptr) return Fail(-EBADF, "pcap file not open");
  if (pcapng_) return NextPcapng(record);
  const uint64_t index = next_index_;
  uint8_t header[kRecordHeaderSize];
  const size_t got = std::fread(header, 1, sizeof header, file_);
  if (got == 0 && std::feof(file_)) return 0;
  if (got < sizeof header) {
    if (std::ferror(file_)) return Fail(-EIO, "record " + std::to_string(index) + ": read error");
    return Fail(-EBADMSG, "record " + std::to_string(index) + ": file cut short inside the record header (" +
                              std::to_string(got) + " of 16 bytes)");
  }
  const uint32_t seconds = U32(header + 0);
  const uint32_t fraction = U32(header + 4);
  const uint32_t included = U32(header + 8);
  const uint32_t original = U32(header + 12);
  if (included > kMaxRecordSize) {
    return Fail(-EBADMSG, "record " + std::to_string(index) + ": captured length " + std::to_string(included) +
                              " is beyond any real frame; the file is corrupt");
  }
  buffer_.resize(included);
  const size_t body = included == 0 ? 0 : std::fread(buffer_.data(), 1, included, file_);
  if (body < included) {
    if (std::ferror(file_)) return Fail(-EIO, "record " + std::to_string(index) + ": read error");
    return Fail(-EBADMSG, "record " + std::to_string(index) + ": file cut short inside the packet (" +
                              std::to_string(body) + " of " + std::to_string(included) + " bytes)");
  }
  ++next_index_;
  record->index = index;
  record->timestamp_ns = uint64_t{seconds} * 1'000'000'000 + (nanosecond_ ? fraction : uint64_t{fraction} * 1000);
  record->raw = std::span<const uint8_t>(buffer_.data(), buffer_.size());
  record->original_length = original;
  record->truncated = included < original;
  record->link_type = link_type_;
  record->interface_id = 0;
  record->ip_packet = PcapExtractIpPacket(link_type_, record->raw, &record->not_ip, &record->malformed);
  return 1;
}

// ---------------------------------------------------------------------------------------------------------------
// PcapReader: pcapng

namespace {

// A timestamp of `ticks` units of if_tsresol, plus if_tsoffset seconds, in nanoseconds since the epoch (saturating:
// a corrupt resolution or offset gives a wrong time, never undefined behaviour).
uint64_t PcapngTimestampNs(uint64_t ticks, uint8_t tsresol, int64_t tsoffset) {
  using Wide = __int128;
  const unsigned exponent = tsresol & 0x7F;
  Wide ns;
  if (tsresol & 0x80) {
    ns = (Wide{ticks} * 1'000'000'000) >> exponent;  // units of 2^-exponent s; ticks * 10^9 < 2^94
  } else if (exponent <= 9) {
    int64_t scale = 1;
    for (unsigned i = exponent; i < 9; ++i) scale *= 10;
    ns = Wide{ticks} * scale;
  } else {
    Wide divisor = 1;
    for (unsigned i = 9; i < exponent && divisor <= Wide{ticks}; ++i) divisor *= 10;
    ns = Wide{ticks} / divisor;
  }
  ns += Wide{tsoffset} * 1'000'000'000;
  if (ns < 0) return 0;
  return ns > Wide{UINT64_MAX} ? UINT64_MAX : static_cast<uint64_t>(ns);
}

}  // namespace

uint16_t PcapReader::U16(const uint8_t* p) const {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return swapped_ ? __builtin_bswap16(v) : v;
}

int PcapReader::OpenPcapng() {
  pcapng_ = true;
  offset_ = 0;
  uint32_t type = 0;
  size_t body_size = 0;
  // The first Section Header Block (ReadBlock knows Open has consumed its type).
  const int rc = ReadBlock(&type, &body_size);
  if (rc == 0) return Fail(-EBADMSG, "pcapng file cut short inside its Section Header Block");
  return rc < 0 ? rc : 0;
}

int PcapReader::ReadBlock(uint32_t* type, size_t* body_size) {
  const std::string where = "pcapng block at byte " + std::to_string(offset_);
  uint8_t head[12];
  // The first block's type was read by Open to recognise the format.
  const bool type_known = offset_ == 0;
  size_t got = type_known ? 4 : 0;
  if (type_known) PutNative32(head, kBlockSectionHeader);
  got += std::fread(head + got, 1, 8 - got, file_);
  if (got == 0 && std::feof(file_)) return 0;
  auto cut_short = [&](const char* inside) {
    if (std::ferror(file_)) return Fail(-EIO, where + ": read error");
    return Fail(-EBADMSG, where + ": file cut short inside " + inside);
  };
  if (got < 8) return cut_short("the block header");
  std::memcpy(type, head, 4);
  size_t header = 8;
  if (*type == kBlockSectionHeader) {
    // A new section: its byte-order magic says how to read its length and everything up to the next section.
    if (std::fread(head + 8, 1, 4, file_) < 4) return cut_short("the Section Header Block");
    header = 12;
    uint32_t magic;
    std::memcpy(&magic, head + 8, 4);
    if (magic == kByteOrderMagic) {
      swapped_ = false;
    } else if (magic == __builtin_bswap32(kByteOrderMagic)) {
      swapped_ = true;
    } else {
      char text[64];
      std::snprintf(text, sizeof text, ": bad byte-order magic 0x%08x", magic);
      return Fail(-EBADMSG, where + text);
    }
    interfaces_.clear();
  } else {
    *type = U32(head);
  }
  const uint32_t total = U32(head + 4);
  const size_t minimum = *type == kBlockSectionHeader ? 28 : kBlockOverhead;
  if (total < minimum || total % 4 != 0 || total > kMaxBlockSize) {
    return Fail(-EBADMSG, where + ": block length " + std::to_string(total) +
                              (total > kMaxBlockSize ? " is beyond any real block" : " is invalid") +
                              "; the file is corrupt");
  }
  // The body, then the trailing copy of the length.
  const size_t rest = total - header;
  buffer_.resize(rest);
  if (std::fread(buffer_.data(), 1, rest, file_) < rest) return cut_short("the block");
  if (U32(buffer_.data() + rest - 4) != total) {
    return Fail(-EBADMSG, where + ": trailing block length " + std::to_string(U32(buffer_.data() + rest - 4)) +
                              " differs from " + std::to_string(total));
  }
  if (header == 12) buffer_.insert(buffer_.begin(), head + 8, head + 12);  // the byte-order magic is body
  *body_size = total - kBlockOverhead;
  offset_ += total;
  if (*type == kBlockSectionHeader && ParseSectionHeader() < 0) return sticky_error_;
  return 1;
}

int PcapReader::ParseSectionHeader() {
  // byte-order magic(4) major(2) minor(2) section length(8) options
  const uint16_t major = U16(buffer_.data() + 4);
  const uint16_t minor = U16(buffer_.data() + 6);
  if (major != kPcapngMajor) {
    return Fail(-EPROTONOSUPPORT,
                "unsupported pcapng version " + std::to_string(major) + "." + std::to_string(minor));
  }
  return 0;
}

int PcapReader::ParseInterface(size_t body_size) {
  const std::string where = "pcapng Interface Description Block " + std::to_string(interfaces_.size());
  if (body_size < 8) return Fail(-EBADMSG, where + ": too short (" + std::to_string(body_size) + " bytes)");
  Interface interface;
  interface.link_type = U16(buffer_.data());
  interface.snaplen = U32(buffer_.data() + 4);
  // Options: code(2) length(2) value padded to 4 bytes, until opt_endofopt or the end of the block.
  size_t at = 8;
  while (at + 4 <= body_size) {
    const uint16_t code = U16(buffer_.data() + at);
    const uint16_t length = U16(buffer_.data() + at + 2);
    if (code == kOptEnd) break;
    const size_t padded = (size_t{length} + 3) & ~size_t{3};
    if (padded > body_size - at - 4) {
      return Fail(-EBADMSG, where + ": option " + std::to_string(code) + " overruns the block");
    }
    const uint8_t* value = buffer_.data() + at + 4;
    if (code == kOptIfTsresol && length == 1) interface.tsresol = value[0];
    if (code == kOptIfTsoffset && length == 8) {
      uint64_t v;
      std::memcpy(&v, value, 8);
      interface.tsoffset = static_cast<int64_t>(swapped_ ? __builtin_bswap64(v) : v);
    }
    at += 4 + padded;
  }
  if (interfaces_.empty()) SetCurrentInterface(interface);
  interfaces_.push_back(interface);
  return 0;
}

void PcapReader::SetCurrentInterface(const Interface& interface) {
  link_type_ = interface.link_type;
  snaplen_ = interface.snaplen;
  nanosecond_ = interface.tsresol == 9;
}

int PcapReader::NextPcapng(PcapRecord* record) {
  for (;;) {
    uint32_t type = 0;
    size_t body = 0;
    const int rc = ReadBlock(&type, &body);
    if (rc <= 0) return rc;
    const uint64_t index = next_index_;
    const std::string where = "record " + std::to_string(index);
    uint32_t interface_id = 0, captured = 0, original = 0;
    uint64_t ticks = 0;
    size_t data_at = 0;
    if (type == kBlockInterface) {
      if (ParseInterface(body) < 0) return sticky_error_;
      continue;
    } else if (type == kBlockEnhancedPacket) {
      // interface id(4) timestamp high(4) low(4) captured length(4) original length(4) data, padded; options
      if (body < 20) return Fail(-EBADMSG, where + ": Enhanced Packet Block too short");
      interface_id = U32(buffer_.data());
      ticks = uint64_t{U32(buffer_.data() + 4)} << 32 | U32(buffer_.data() + 8);
      captured = U32(buffer_.data() + 12);
      original = U32(buffer_.data() + 16);
      data_at = 20;
    } else if (type == kBlockSimplePacket) {
      // original length(4) data, padded. The captured length is the original cut to interface 0's snaplen; there is
      // no timestamp.
      if (body < 4) return Fail(-EBADMSG, where + ": Simple Packet Block too short");
      original = U32(buffer_.data());
      data_at = 4;
      captured = original;
      if (!interfaces_.empty() && interfaces_[0].snaplen != 0) captured = std::min(captured, interfaces_[0].snaplen);
    } else {
      continue;  // Name resolution, interface statistics, decryption secrets, custom and unknown blocks.
    }
    if (interface_id >= interfaces_.size()) {
      return Fail(-EBADMSG, where + ": packet of interface " + std::to_string(interface_id) + ", but the section " +
                                "describes " + std::to_string(interfaces_.size()));
    }
    if (captured > body - data_at) {
      return Fail(-EBADMSG, where + ": captured length " + std::to_string(captured) + " overruns its block (" +
                                std::to_string(body - data_at) + " bytes)");
    }
    const Interface& interface = interfaces_[interface_id];
    SetCurrentInterface(interface);
    ++next_index_;
    record->index = index;
    record->timestamp_ns =
        type == kBlockSimplePacket ? 0 : PcapngTimestampNs(ticks, interface.tsresol, interface.tsoffset);
    record->raw = std::span<const uint8_t>(buffer_.data() + data_at, captured);
    record->original_length = original;
    record->truncated = captured < original;
    record->link_type = interface.link_type;
    record->interface_id = interface_id;
    record->ip_packet = PcapExtractIpPacket(interface.link_type, record->raw, &record->not_ip, &record->malformed);
    return 1;
  }
}

}  // namespace uroce::wire
