//! The XDP program of a raw device, assembled by hand (no compiler needed at build or run
//! time): it hands the device's AF_XDP socket the frames for the device's address and
//! passes everything else to the kernel, untouched.
//!
//! For an IPv4 address: IPv4 frames to it and ARP frames whose target protocol address is
//! it. For an IPv6 address: IPv6 frames to it or to its solicited-node multicast group
//! (`ff02::1:ffXX:XXXX`, where Neighbour Solicitations for it go; RFC 4291 §2.7.1). The
//! address is baked into the instructions as immediates, so the program needs no map for
//! it; the one map is the XSKMAP that `bpf_redirect_map` looks the socket up in.
//!
//! Every packet load comes after a bounds check against `data_end` (the verifier refuses
//! the program otherwise). Header fields are compared as loaded, in the host's byte order,
//! against immediates made from the wire bytes in the same order ([`wire_u16`],
//! [`wire_u32`]), and with 32-bit compares (`BPF_JMP32`, Linux 5.1), whose immediates are
//! not sign-extended to 64 bits. The fields sit at offsets the verifier's alignment check
//! accepts (it assumes the IP header 2 bytes past a 4-byte boundary, NET_IP_ALIGN).

use std::net::IpAddr;

/// One eBPF instruction, `struct bpf_insn` (linux/bpf.h): opcode, the two register
/// numbers in one byte, a signed offset and a signed immediate.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const _: () = assert!(std::mem::size_of::<Insn>() == 8);

/// `XDP_PASS`: the frame goes on to the kernel's stack.
pub const XDP_PASS: i32 = 2;
/// `BPF_FUNC_redirect_map` (linux/bpf.h, `enum bpf_func_id`).
pub const HELPER_REDIRECT_MAP: i32 = 51;
/// `src_reg` of a 64-bit immediate load that names a map by file descriptor.
const BPF_PSEUDO_MAP_FD: u8 = 1;

// Opcodes: class | size or operation | source (linux/bpf_common.h, linux/bpf.h).
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const LDX_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const LDX_B: u8 = 0x71; // BPF_LDX | BPF_MEM | BPF_B
const AND32_K: u8 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_IMM | BPF_DW
const MOV64_X: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const ADD64_K: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
const JA: u8 = 0x05; // BPF_JMP | BPF_JA
const JGT_X: u8 = 0x2d; // BPF_JMP | BPF_JGT | BPF_X (unsigned, 64-bit)
const JEQ32_K: u8 = 0x16; // BPF_JMP32 | BPF_JEQ | BPF_K
const JNE32_K: u8 = 0x56; // BPF_JMP32 | BPF_JNE | BPF_K
const CALL: u8 = 0x85; // BPF_JMP | BPF_CALL
const EXIT: u8 = 0x95; // BPF_JMP | BPF_EXIT

/// Offsets in `struct xdp_md`, the program's context.
const CTX_DATA: i16 = 0;
const CTX_DATA_END: i16 = 4;
const CTX_RX_QUEUE_INDEX: i16 = 16;

/// Offsets in the frame: the EtherType, the IPv4 destination, ARP's target protocol
/// address and the IPv6 destination, and how far each reaches.
const ETHERTYPE_AT: i16 = 12;
const ETH_END: i32 = 14;
const IPV4_DST_AT: i16 = 14 + 16;
const IPV4_DST_END: i32 = 14 + 20;
const ARP_TPA_AT: i16 = 14 + 24;
const ARP_TPA_END: i32 = 14 + 28;
const IPV6_DST_AT: i16 = 14 + 24;
const IPV6_DST_END: i32 = 14 + 40;
/// IPv4's version and header length byte, its protocol, and the UDP destination port
/// behind a 20-byte header; IPv6's next header, and the UDP destination port behind it.
const IPV4_VIHL_AT: i16 = 14;
const IPV4_PROTO_AT: i16 = 14 + 9;
const IPV4_UDP_DPORT_AT: i16 = 14 + 20 + 2;
const IPV4_UDP_END: i32 = 14 + 20 + 4;
const IPV6_NEXT_AT: i16 = 14 + 6;
const IPV6_UDP_DPORT_AT: i16 = 14 + 40 + 2;
const IPV6_UDP_END: i32 = 14 + 40 + 4;
/// RoCEv2's UDP port (IBTA Annex A17.2.1), as it is on the wire.
const ROCE_PORT_WIRE: [u8; 2] = 4791u16.to_be_bytes();
/// UDP's protocol number.
const IPPROTO_UDP: i32 = 17;

/// Registers: r0 the return value, r1-r5 arguments (clobbered by a call), r6-r9 kept.
#[derive(Clone, Copy)]
#[repr(u8)]
enum Reg {
    R0 = 0,
    R1,
    R2,
    R3,
    R4,
    R5,
    R6,
    R7,
    R8,
    R9,
}

/// Where a jump goes, resolved once the program is whole.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Label {
    Pass,
    Redirect,
    Ipv4,
    Solicited,
    Multicast,
}

/// Instructions with jumps to labels, resolved by [`Asm::finish`].
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    jumps: Vec<(usize, Label)>,
    labels: Vec<(Label, usize)>,
}

impl Asm {
    fn op(&mut self, code: u8, dst: Reg, src: u8, off: i16, imm: i32) {
        // The register byte is two bit-fields, dst_reg first: its low nibble on a
        // little-endian host, its high nibble on a big-endian one.
        let (d, s) = (dst as u8, src);
        let regs = if cfg!(target_endian = "little") { s << 4 | d } else { d << 4 | s };
        self.insns.push(Insn { code, regs, off, imm });
    }

    fn jump(&mut self, code: u8, dst: Reg, src: u8, imm: i32, to: Label) {
        self.jumps.push((self.insns.len(), to));
        self.op(code, dst, src, 0, imm);
    }

    fn label(&mut self, l: Label) {
        self.labels.push((l, self.insns.len()));
    }

    /// `dst = *(size *)(src + off)`.
    fn load(&mut self, code: u8, dst: Reg, src: Reg, off: i16) {
        self.op(code, dst, src as u8, off, 0);
    }

    /// Goes to `to` unless `data + end <= data_end` (r2 data, r3 data_end, r4 scratch):
    /// the bounds check the verifier wants before loading anything below `end`.
    fn need(&mut self, end: i32, to: Label) {
        self.op(MOV64_X, Reg::R4, Reg::R2 as u8, 0, 0);
        self.op(ADD64_K, Reg::R4, 0, 0, end);
        self.jump(JGT_X, Reg::R4, Reg::R3 as u8, 0, to);
    }

    fn finish(mut self) -> Vec<Insn> {
        for (at, to) in &self.jumps {
            let target = self.labels.iter().find(|(l, _)| l == to).map(|(_, i)| *i).expect("every label placed");
            self.insns[*at].off = (target as isize - *at as isize - 1) as i16;
        }
        self.insns
    }
}

/// The 16 bits at a frame's `bytes` as the program loads them (host byte order).
fn wire_u16(bytes: [u8; 2]) -> i32 {
    i32::from(u16::from_ne_bytes(bytes))
}

/// The 32 bits at a frame's `bytes` as the program loads them, as an immediate.
fn wire_u32(bytes: [u8; 4]) -> i32 {
    u32::from_ne_bytes(bytes) as i32
}

/// The program for a device at `ip`, redirecting through the XSKMAP `xskmap_fd`.
pub fn build(ip: IpAddr, xskmap_fd: i32) -> Vec<Insn> {
    let mut a = Asm::default();
    a.op(MOV64_X, Reg::R6, Reg::R1 as u8, 0, 0); // r6 = ctx (r1 is lost to the call)
    a.load(LDX_W, Reg::R2, Reg::R6, CTX_DATA); // r2 = ctx->data
    a.load(LDX_W, Reg::R3, Reg::R6, CTX_DATA_END); // r3 = ctx->data_end
    a.need(ETH_END, Label::Pass); // the Ethernet header is whole
    a.load(LDX_H, Reg::R5, Reg::R2, ETHERTYPE_AT); // r5 = EtherType
    match ip {
        IpAddr::V4(v4) => ipv4_matches(&mut a, v4.octets()),
        IpAddr::V6(v6) => ipv6_matches(&mut a, v6.octets()),
    }
    a.label(Label::Redirect);
    a.load(LDX_W, Reg::R2, Reg::R6, CTX_RX_QUEUE_INDEX); // r2 = key: the frame's queue
    a.op(LD_IMM64, Reg::R1, BPF_PSEUDO_MAP_FD, 0, xskmap_fd); // r1 = the XSKMAP...
    a.op(0, Reg::R0, 0, 0, 0); // ...(a 64-bit load takes two slots; upper half 0)
    a.op(MOV64_K, Reg::R3, 0, 0, XDP_PASS); // r3 = flags: XDP_PASS if no socket at the key
    a.op(CALL, Reg::R0, 0, 0, HELPER_REDIRECT_MAP); // r0 = bpf_redirect_map(r1, r2, r3)
    a.op(EXIT, Reg::R0, 0, 0, 0); // return r0
    a.label(Label::Pass);
    a.op(MOV64_K, Reg::R0, 0, 0, XDP_PASS); // r0 = XDP_PASS
    a.op(EXIT, Reg::R0, 0, 0, 0); // return r0
    a.finish()
}

/// IPv4 to `ip`, or ARP about `ip`, go to Redirect; the rest to Pass. r5 holds the
/// EtherType.
fn ipv4_matches(a: &mut Asm, ip: [u8; 4]) {
    a.jump(JEQ32_K, Reg::R5, 0, wire_u16([0x08, 0x00]), Label::Ipv4); // IPv4?
    a.jump(JNE32_K, Reg::R5, 0, wire_u16([0x08, 0x06]), Label::Pass); // else ARP, or pass
    a.need(ARP_TPA_END, Label::Pass); // the ARP body is whole up to the target address
    a.load(LDX_W, Reg::R5, Reg::R2, ARP_TPA_AT); // r5 = target protocol address
    a.jump(JEQ32_K, Reg::R5, 0, wire_u32(ip), Label::Redirect); // ours: redirect
    a.jump(JA, Reg::R0, 0, 0, Label::Pass); // another's: pass
    a.label(Label::Ipv4);
    a.need(IPV4_DST_END, Label::Pass); // the IPv4 header is whole up to the destination
    a.load(LDX_W, Reg::R5, Reg::R2, IPV4_DST_AT); // r5 = destination address
    a.jump(JEQ32_K, Reg::R5, 0, wire_u32(ip), Label::Redirect); // ours: redirect
    a.op(AND32_K, Reg::R5, 0, 0, wire_u32([0xf0, 0, 0, 0])); // r5 = its first four bits
    a.jump(JNE32_K, Reg::R5, 0, wire_u32([0xe0, 0, 0, 0]), Label::Pass); // not 224/4: pass
    a.need(IPV4_UDP_END, Label::Pass); // a 20-byte header and a UDP one up to its port
    a.load(LDX_B, Reg::R5, Reg::R2, IPV4_VIHL_AT); // r5 = version and header length
    a.jump(JNE32_K, Reg::R5, 0, 0x45, Label::Pass); // options (RoCEv2 has none): pass
    a.load(LDX_B, Reg::R5, Reg::R2, IPV4_PROTO_AT); // r5 = protocol
    a.jump(JNE32_K, Reg::R5, 0, IPPROTO_UDP, Label::Pass); // not UDP: pass
    a.load(LDX_H, Reg::R5, Reg::R2, IPV4_UDP_DPORT_AT); // r5 = UDP destination port
    a.jump(JEQ32_K, Reg::R5, 0, wire_u16(ROCE_PORT_WIRE), Label::Redirect); // RoCEv2
    a.jump(JA, Reg::R0, 0, 0, Label::Pass); // another group's traffic: the kernel's
}

/// IPv6 to `ip` or to its solicited-node group go to Redirect; the rest to Pass. r5
/// holds the EtherType.
fn ipv6_matches(a: &mut Asm, ip: [u8; 16]) {
    let mut group = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0];
    group[13..].copy_from_slice(&ip[13..]);
    let words = |b: [u8; 16]| [0, 4, 8, 12].map(|i| wire_u32([b[i], b[i + 1], b[i + 2], b[i + 3]]));
    let (own, sol) = (words(ip), words(group));
    a.jump(JNE32_K, Reg::R5, 0, wire_u16([0x86, 0xdd]), Label::Pass); // not IPv6: pass
    a.need(IPV6_DST_END, Label::Pass); // the IPv6 header is whole
    let regs = [Reg::R5, Reg::R7, Reg::R8, Reg::R9];
    for (i, r) in regs.into_iter().enumerate() {
        a.load(LDX_W, r, Reg::R2, IPV6_DST_AT + 4 * i as i16); // the destination, 4 words
    }
    for i in 0..3 {
        a.jump(JNE32_K, regs[i], 0, own[i], Label::Solicited); // a word differs: not ours
    }
    a.jump(JEQ32_K, regs[3], 0, own[3], Label::Redirect); // all four match: ours
    a.label(Label::Solicited);
    for i in 0..3 {
        a.jump(JNE32_K, regs[i], 0, sol[i], Label::Multicast); // not our group either
    }
    a.jump(JEQ32_K, regs[3], 0, sol[3], Label::Redirect); // our solicited-node group
    a.label(Label::Multicast);
    a.op(AND32_K, Reg::R5, 0, 0, wire_u32([0xff, 0, 0, 0])); // r5 = the first byte
    a.jump(JNE32_K, Reg::R5, 0, wire_u32([0xff, 0, 0, 0]), Label::Pass); // unicast: pass
    a.need(IPV6_UDP_END, Label::Pass); // the UDP header up to its port
    a.load(LDX_B, Reg::R5, Reg::R2, IPV6_NEXT_AT); // r5 = next header
    a.jump(JNE32_K, Reg::R5, 0, IPPROTO_UDP, Label::Pass); // not UDP: pass
    a.load(LDX_H, Reg::R5, Reg::R2, IPV6_UDP_DPORT_AT); // r5 = UDP destination port
    a.jump(JEQ32_K, Reg::R5, 0, wire_u16(ROCE_PORT_WIRE), Label::Redirect); // RoCEv2
    a.jump(JA, Reg::R0, 0, 0, Label::Pass); // another group's traffic: the kernel's
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `XDP_REDIRECT`: the frame went where `bpf_redirect_map` said.
    const XDP_REDIRECT: i32 = 4;

    /// Runs `prog` on `frame` as the kernel would for the subset it uses, with a socket
    /// in the XSKMAP at key 0 and the frame on queue `queue`; returns the XDP action.
    /// Every packet load is checked against the frame: an unchecked one panics.
    fn run(prog: &[Insn], frame: &[u8], queue: u32) -> i32 {
        const DATA: u64 = 0x1000;
        let mut r = [0u64; 11];
        r[1] = 0xc7c; // the context
        let mut pc = 0;
        loop {
            let i = prog[pc];
            let (dst, src) = if cfg!(target_endian = "little") {
                (usize::from(i.regs & 0xf), usize::from(i.regs >> 4))
            } else {
                (usize::from(i.regs >> 4), usize::from(i.regs & 0xf))
            };
            let target = (pc as isize + 1 + isize::from(i.off)) as usize;
            pc += 1;
            let load = |addr: u64, n: usize| -> u64 {
                let at = (addr - DATA) as usize;
                assert!(at + n <= frame.len(), "load of {n} at {at} beyond the frame");
                frame[at..at + n].iter().rev().fold(0, |v, b| v << 8 | u64::from(*b))
                // little-endian host
            };
            match i.code {
                LDX_W if r[src] == 0xc7c => {
                    r[dst] = match i.off {
                        CTX_DATA => DATA,
                        CTX_DATA_END => DATA + frame.len() as u64,
                        CTX_RX_QUEUE_INDEX => u64::from(queue),
                        o => panic!("context offset {o}"),
                    }
                }
                LDX_W => r[dst] = load(r[src].wrapping_add(i.off as u64), 4),
                LDX_H => r[dst] = load(r[src].wrapping_add(i.off as u64), 2),
                LDX_B => r[dst] = load(r[src].wrapping_add(i.off as u64), 1),
                AND32_K => r[dst] = u64::from(r[dst] as u32 & i.imm as u32),
                LD_IMM64 => pc += 1,
                MOV64_X => r[dst] = r[src],
                MOV64_K => r[dst] = i.imm as i64 as u64,
                ADD64_K => r[dst] = r[dst].wrapping_add(i.imm as i64 as u64),
                JA => pc = target,
                JGT_X if r[dst] > r[src] => pc = target,
                JEQ32_K if r[dst] as u32 == i.imm as u32 => pc = target,
                JNE32_K if r[dst] as u32 != i.imm as u32 => pc = target,
                JGT_X | JEQ32_K | JNE32_K => {}
                CALL => return if r[2] == 0 { XDP_REDIRECT } else { r[3] as i32 },
                EXIT => return r[0] as i32,
                c => panic!("opcode {c:#x}"),
            }
        }
    }

    fn eth(ethertype: [u8; 2], body: &[u8]) -> Vec<u8> {
        let mut f = vec![0xff; 12];
        f.extend_from_slice(&ethertype);
        f.extend_from_slice(body);
        f
    }

    fn ipv4_to(dst: [u8; 4]) -> Vec<u8> {
        let mut h = vec![0x45, 0, 0, 20, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 9, 0, 1];
        h.extend_from_slice(&dst);
        eth([8, 0], &h)
    }

    /// `frame` (from [`ipv4_to`] or [`ipv6_to`]) with a UDP header to `port` after it.
    fn with_udp(mut frame: Vec<u8>, port: u16) -> Vec<u8> {
        frame.extend_from_slice(&[0xc0, 0x00]);
        frame.extend_from_slice(&port.to_be_bytes());
        frame.extend_from_slice(&[0, 8, 0, 0]);
        frame
    }

    fn arp_for(target: [u8; 4]) -> Vec<u8> {
        let mut b = vec![0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 9, 0, 1, 0, 0, 0, 0, 0, 0];
        b.extend_from_slice(&target);
        eth([8, 6], &b)
    }

    fn ipv6_to(dst: [u8; 16]) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        h.extend_from_slice(&[0xfd, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        h.extend_from_slice(&dst);
        eth([0x86, 0xdd], &h)
    }

    #[test]
    fn ipv4_and_arp_for_the_device_are_redirected_and_the_rest_passed() {
        if cfg!(target_endian = "big") {
            return; // the interpreter above loads as a little-endian host does
        }
        // .200: a last byte with the top bit set, which a sign-extended 64-bit compare
        // would get wrong.
        let me = [10, 9, 0, 200];
        let prog = build(IpAddr::from(me), 7);
        assert_eq!(run(&prog, &ipv4_to(me), 0), XDP_REDIRECT);
        assert_eq!(run(&prog, &arp_for(me), 0), XDP_REDIRECT);
        assert_eq!(run(&prog, &ipv4_to([10, 9, 0, 1]), 0), XDP_PASS);
        assert_eq!(run(&prog, &arp_for([10, 9, 0, 1]), 0), XDP_PASS);
        assert_eq!(run(&prog, &ipv6_to([0; 16]), 0), XDP_PASS);
        // A frame on another queue finds no socket: the kernel gets it.
        assert_eq!(run(&prog, &ipv4_to(me), 3), XDP_PASS);
        // Truncated anywhere, a frame is passed, and nothing past its end is read.
        for f in [ipv4_to(me), arp_for(me)] {
            for len in 0..f.len() {
                assert_eq!(run(&prog, &f[..len], 0), XDP_PASS, "cut to {len}");
            }
        }
    }

    #[test]
    fn ipv6_for_the_device_or_its_solicited_node_group_is_redirected() {
        if cfg!(target_endian = "big") {
            return;
        }
        let me: [u8; 16] = "fd00:9::a:bcde:f012".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let prog = build(IpAddr::from(me), 7);
        let group: [u8; 16] = "ff02::1:ffde:f012".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let other_group: [u8; 16] = "ff02::1:ffde:f013".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let mut neighbour = me;
        neighbour[15] ^= 1;
        assert_eq!(run(&prog, &ipv6_to(me), 0), XDP_REDIRECT);
        assert_eq!(run(&prog, &ipv6_to(group), 0), XDP_REDIRECT);
        assert_eq!(run(&prog, &ipv6_to(other_group), 0), XDP_PASS);
        assert_eq!(run(&prog, &ipv6_to(neighbour), 0), XDP_PASS);
        assert_eq!(run(&prog, &ipv4_to([10, 9, 0, 2]), 0), XDP_PASS);
        let f = ipv6_to(me);
        for len in 0..f.len() {
            assert_eq!(run(&prog, &f[..len], 0), XDP_PASS, "cut to {len}");
        }
    }

    #[test]
    fn rocev2_to_multicast_groups_is_redirected_and_other_multicast_passed() {
        if cfg!(target_endian = "big") {
            return;
        }
        let prog = build(IpAddr::from([10, 9, 0, 200]), 7);
        let roce = with_udp(ipv4_to([239, 1, 2, 3]), 4791);
        assert_eq!(run(&prog, &roce, 0), XDP_REDIRECT);
        assert_eq!(run(&prog, &with_udp(ipv4_to([239, 1, 2, 3]), 5353), 0), XDP_PASS);
        assert_eq!(run(&prog, &with_udp(ipv4_to([10, 9, 0, 7]), 4791), 0), XDP_PASS, "another's unicast");
        let mut options = roce.clone();
        options[14] = 0x46;
        assert_eq!(run(&prog, &options, 0), XDP_PASS, "a header with options");
        let mut tcp = roce.clone();
        tcp[14 + 9] = 6;
        assert_eq!(run(&prog, &tcp, 0), XDP_PASS);
        // Cut before the port, a frame is passed, and nothing past its end is read.
        for len in 0..IPV4_UDP_END as usize {
            assert_eq!(run(&prog, &roce[..len], 0), XDP_PASS, "cut to {len}");
        }
        let me6: [u8; 16] = "fd00:9::a:bcde:f012".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let prog6 = build(IpAddr::from(me6), 7);
        let group6: [u8; 16] = "ff0e::9:1".parse::<std::net::Ipv6Addr>().unwrap().octets();
        let roce6 = with_udp(ipv6_to(group6), 4791);
        assert_eq!(run(&prog6, &roce6, 0), XDP_REDIRECT);
        assert_eq!(run(&prog6, &with_udp(ipv6_to(group6), 53), 0), XDP_PASS);
        let mut next_tcp = roce6.clone();
        next_tcp[14 + 6] = 6;
        assert_eq!(run(&prog6, &next_tcp, 0), XDP_PASS);
        for len in 0..IPV6_UDP_END as usize {
            assert_eq!(run(&prog6, &roce6[..len], 0), XDP_PASS, "cut to {len}");
        }
    }
}
