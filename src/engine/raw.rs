//! Raw packet QPs' flow steering (Linux verbs' `ibv_create_flow`; IBTA leaves raw Ethernet
//! QPs to the vendor): which of a device's raw packet QPs an Ethernet frame goes to.
//!
//! A rule is a list of specs, each a layer of the frame (Ethernet, IPv4, IPv6, TCP, UDP)
//! with a value and a mask laid out as verbs' filter structures lay them out, in network
//! byte order; a frame matches a spec when it has that layer and its fields, masked, equal
//! the value, masked. A frame goes to the QP of the matching normal rule with the lowest
//! priority value (the oldest on a tie), else to the default rules' QPs; sniffers get a
//! copy of everything.

use std::collections::BTreeMap;

/// Most flow rules a device holds: each is state an application makes the device keep.
pub const MAX_FLOWS: usize = 4096;
/// Most specs in one rule.
pub const MAX_SPECS_PER_FLOW: usize = 8;

/// A layer a spec matches on, with the length of its filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// `ibv_flow_eth_filter`: destination MAC, source MAC, EtherType (the one after any
    /// VLAN tag), VLAN TCI: 16 bytes.
    Eth,
    /// `ibv_flow_ipv4_filter`: source and destination address: 8 bytes.
    Ipv4,
    /// `ibv_flow_ipv4_ext_filter`: addresses, protocol, TOS, TTL, flags: 12 bytes.
    Ipv4Ext,
    /// `ibv_flow_ipv6_filter`: addresses, flow label, next header, traffic class, hop
    /// limit: 39 bytes.
    Ipv6,
    /// `ibv_flow_tcp_udp_filter` on TCP: destination and source port: 4 bytes.
    Tcp,
    /// The same on UDP.
    Udp,
}

impl Layer {
    /// The filter's length in bytes.
    pub fn filter_len(self) -> usize {
        match self {
            Layer::Eth => 16,
            Layer::Ipv4 => 8,
            Layer::Ipv4Ext => 12,
            Layer::Ipv6 => 39,
            Layer::Tcp | Layer::Udp => 4,
        }
    }
}

/// One spec: a layer, and its value and mask (each `layer.filter_len()` bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowSpec {
    /// The layer.
    pub layer: Layer,
    /// Field values.
    pub value: Vec<u8>,
    /// Which bits of them count.
    pub mask: Vec<u8>,
}

/// What a rule does with the frames it matches (`ibv_flow_attr_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowKind {
    /// Steers matching frames to its QP.
    Normal,
    /// Takes the frames no normal rule took.
    AllDefault,
    /// Takes the multicast frames no normal rule took.
    McDefault,
    /// Gets a copy of every frame.
    Sniffer,
}

/// A flow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRule {
    /// What it does.
    pub kind: FlowKind,
    /// Lower wins among normal rules.
    pub priority: u16,
    /// All must match.
    pub specs: Vec<FlowSpec>,
}

/// Why a rule was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowError {
    /// A spec's value or mask is not its layer's length, or there are too many specs.
    Malformed,
    /// The device holds [`MAX_FLOWS`] rules.
    TooMany,
}

/// Where a frame goes ([`FlowTable::route`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Route {
    /// The QPs that take it.
    pub takers: Vec<u32>,
    /// The QPs that get a copy of everything.
    pub sniffers: Vec<u32>,
}

/// The device's rules, by id.
#[derive(Debug, Default)]
pub struct FlowTable {
    rules: BTreeMap<u32, (u32, FlowRule)>,
    next_id: u32,
}

impl FlowTable {
    /// Adds `rule` steering to QP `qpn`; returns its id.
    pub fn add(&mut self, qpn: u32, rule: FlowRule) -> Result<u32, FlowError> {
        let well_formed = rule.specs.len() <= MAX_SPECS_PER_FLOW
            && rule.specs.iter().all(|s| s.value.len() == s.layer.filter_len() && s.mask.len() == s.value.len());
        if !well_formed {
            return Err(FlowError::Malformed);
        }
        if self.rules.len() >= MAX_FLOWS {
            return Err(FlowError::TooMany);
        }
        self.next_id = self.next_id.wrapping_add(1);
        while self.rules.contains_key(&self.next_id) {
            self.next_id = self.next_id.wrapping_add(1);
        }
        self.rules.insert(self.next_id, (qpn, rule));
        Ok(self.next_id)
    }

    /// Removes rule `id`; false if there is none.
    pub fn remove(&mut self, id: u32) -> bool {
        self.rules.remove(&id).is_some()
    }

    /// Removes every rule of QP `qpn` (it is destroyed).
    pub fn forget_qp(&mut self, qpn: u32) {
        self.rules.retain(|_, (q, _)| *q != qpn);
    }

    /// Rules held.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when no rule is held.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The QPs `frame` goes to, each once, in no particular order.
    pub fn targets(&self, frame: &[u8]) -> Vec<u32> {
        let Route { mut takers, sniffers } = self.route(frame);
        takers.extend(sniffers);
        takers.sort_unstable();
        takers.dedup();
        takers
    }

    /// Who takes `frame`: the QP of the matching normal rule, else the default rules' QPs;
    /// and, apart, the sniffers.
    pub fn route(&self, frame: &[u8]) -> Route {
        let Some(f) = Fields::of(frame) else { return Route::default() };
        let matching = || self.rules.values().filter(|(_, r)| r.specs.iter().all(|s| f.matches(s)));
        let steered =
            matching().filter(|(_, r)| r.kind == FlowKind::Normal).min_by_key(|(_, r)| r.priority).map(|&(q, _)| q);
        let multicast = frame[0] & 1 == 1;
        let mut takers: Vec<u32> = match steered {
            Some(q) => vec![q],
            None => matching()
                .filter(|(_, r)| r.kind == FlowKind::AllDefault || (multicast && r.kind == FlowKind::McDefault))
                .map(|&(q, _)| q)
                .collect(),
        };
        let mut sniffers: Vec<u32> = matching().filter(|(_, r)| r.kind == FlowKind::Sniffer).map(|&(q, _)| q).collect();
        for v in [&mut takers, &mut sniffers] {
            v.sort_unstable();
            v.dedup();
        }
        Route { takers, sniffers }
    }
}

/// Receive-side scaling of a raw packet QP (Linux verbs' `ibv_rx_hash_conf` over an
/// indirection table of work queues): a frame goes to the work queue its Toeplitz hash
/// names, over the fields `fields` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxHash {
    /// The Toeplitz key (verbs' `rx_hash_key`).
    pub key: Vec<u8>,
    /// Which fields feed the hash ([`HASH_SRC_IPV4`] and the rest, verbs' values).
    pub fields: u64,
    /// The indirection table: each entry a work queue (an SRQ with its CQ and PD).
    pub table: Vec<WorkQueue>,
}

/// A receive work queue (`ibv_wq`): receives posted to an SRQ, completed on a CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkQueue {
    /// Where its receives wait.
    pub srq: u32,
    /// Where they complete.
    pub cq: u32,
    /// The protection domain its buffers belong to.
    pub pd: super::mem::Pd,
}

/// `IBV_RX_HASH_SRC_IPV4` and the other fields an [`RxHash`] may select.
pub const HASH_SRC_IPV4: u64 = 1 << 0;
/// Destination IPv4 address.
pub const HASH_DST_IPV4: u64 = 1 << 1;
/// Source IPv6 address.
pub const HASH_SRC_IPV6: u64 = 1 << 2;
/// Destination IPv6 address.
pub const HASH_DST_IPV6: u64 = 1 << 3;
/// TCP source port.
pub const HASH_SRC_PORT_TCP: u64 = 1 << 4;
/// TCP destination port.
pub const HASH_DST_PORT_TCP: u64 = 1 << 5;
/// UDP source port.
pub const HASH_SRC_PORT_UDP: u64 = 1 << 6;
/// UDP destination port.
pub const HASH_DST_PORT_UDP: u64 = 1 << 7;
/// Every field this engine hashes on.
pub const HASH_FIELDS_KNOWN: u64 = (1 << 8) - 1;

impl RxHash {
    /// The work queue `frame` goes to (`None`: an empty table or a frame too short).
    pub fn pick(&self, frame: &[u8]) -> Option<WorkQueue> {
        let f = Fields::of(frame)?;
        let n = self.table.len();
        (n > 0).then(|| self.table[toeplitz(&self.key, &f.hash_input(self.fields)) as usize % n])
    }
}

/// The Toeplitz hash of `input` under `key` (Microsoft's RSS specification): for each set
/// bit of the input, XOR in the 32 key bits starting at that bit's position.
pub fn toeplitz(key: &[u8], input: &[u8]) -> u32 {
    let key_bit = |i: usize| key.get(i / 8).is_some_and(|b| b >> (7 - i % 8) & 1 == 1);
    let mut window: u32 = (0..32).fold(0, |w, i| w << 1 | u32::from(key_bit(i)));
    let mut hash = 0;
    for (i, byte) in input.iter().enumerate() {
        for bit in 0..8 {
            if byte >> (7 - bit) & 1 == 1 {
                hash ^= window;
            }
            window = window << 1 | u32::from(key_bit(i * 8 + bit + 32));
        }
    }
    hash
}

/// A frame's fields, each layer in its filter's layout (`None`: the frame lacks it).
struct Fields {
    eth: [u8; 16],
    ipv4_ext: Option<[u8; 12]>,
    ipv6: Option<[u8; 39]>,
    tcp: Option<[u8; 4]>,
    udp: Option<[u8; 4]>,
}

const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;

impl Fields {
    /// Reads the headers at their fixed places (IEEE 802.3 and 802.1Q, RFC 791, RFC 8200,
    /// RFC 793 and 768 ports); `None` for a frame shorter than an Ethernet header.
    fn of(frame: &[u8]) -> Option<Fields> {
        let mut eth = [0u8; 16];
        eth[..12].copy_from_slice(frame.get(..12)?);
        let mut at = 12;
        let mut ether_type = u16::from_be_bytes(frame.get(at..at + 2)?.try_into().ok()?);
        at += 2;
        if ether_type == ETHERTYPE_VLAN {
            eth[14..16].copy_from_slice(frame.get(at..at + 2)?);
            ether_type = u16::from_be_bytes(frame.get(at + 2..at + 4)?.try_into().ok()?);
            at += 4;
        }
        eth[12..14].copy_from_slice(&ether_type.to_be_bytes());
        let mut f = Fields { eth, ipv4_ext: None, ipv6: None, tcp: None, udp: None };
        let l3 = &frame[at.min(frame.len())..];
        let (proto, l4) = match ether_type {
            ETHERTYPE_IPV4 => f.read_ipv4(l3),
            ETHERTYPE_IPV6 => f.read_ipv6(l3),
            _ => (None, &[][..]),
        };
        if let Some(ports) = l4.get(..4) {
            let mut p = [0u8; 4];
            // The filter puts the destination port first.
            p[..2].copy_from_slice(&ports[2..4]);
            p[2..].copy_from_slice(&ports[..2]);
            match proto {
                Some(6) => f.tcp = Some(p),
                Some(17) => f.udp = Some(p),
                _ => {}
            }
        }
        Some(f)
    }

    fn read_ipv4<'a>(&mut self, h: &'a [u8]) -> (Option<u8>, &'a [u8]) {
        let Some(fixed) = h.get(..20).filter(|b| b[0] >> 4 == 4) else { return (None, &[]) };
        let mut v = [0u8; 12];
        v[..8].copy_from_slice(&fixed[12..20]);
        (v[8], v[9], v[10], v[11]) = (fixed[9], fixed[1], fixed[8], fixed[6] >> 5);
        self.ipv4_ext = Some(v);
        let ihl = usize::from(fixed[0] & 0x0f) * 4;
        (Some(fixed[9]), h.get(ihl..).unwrap_or(&[]))
    }

    fn read_ipv6<'a>(&mut self, h: &'a [u8]) -> (Option<u8>, &'a [u8]) {
        let Some(fixed) = h.get(..40).filter(|b| b[0] >> 4 == 6) else { return (None, &[]) };
        let mut v = [0u8; 39];
        v[..32].copy_from_slice(&fixed[8..40]);
        let word = u32::from_be_bytes([fixed[0], fixed[1], fixed[2], fixed[3]]);
        v[32..36].copy_from_slice(&(word & 0x000f_ffff).to_be_bytes());
        (v[36], v[37], v[38]) = (fixed[6], (word >> 20) as u8, fixed[7]);
        self.ipv6 = Some(v);
        (Some(fixed[6]), &h[40..])
    }

    /// The hash input RSS takes: addresses then ports, source before destination, each
    /// only if selected and present.
    fn hash_input(&self, fields: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(36);
        let mut take = |bit: u64, bytes: Option<&[u8]>| {
            if fields & bit != 0 {
                out.extend_from_slice(bytes.unwrap_or(&[]));
            }
        };
        take(HASH_SRC_IPV4, self.ipv4_ext.as_ref().map(|v| &v[..4]));
        take(HASH_DST_IPV4, self.ipv4_ext.as_ref().map(|v| &v[4..8]));
        take(HASH_SRC_IPV6, self.ipv6.as_ref().map(|v| &v[..16]));
        take(HASH_DST_IPV6, self.ipv6.as_ref().map(|v| &v[16..32]));
        // The port filters hold the destination first.
        take(HASH_SRC_PORT_TCP, self.tcp.as_ref().map(|v| &v[2..4]));
        take(HASH_DST_PORT_TCP, self.tcp.as_ref().map(|v| &v[..2]));
        take(HASH_SRC_PORT_UDP, self.udp.as_ref().map(|v| &v[2..4]));
        take(HASH_DST_PORT_UDP, self.udp.as_ref().map(|v| &v[..2]));
        out
    }

    fn layer(&self, layer: Layer) -> Option<&[u8]> {
        match layer {
            Layer::Eth => Some(&self.eth),
            Layer::Ipv4 => self.ipv4_ext.as_ref().map(|v| &v[..8]),
            Layer::Ipv4Ext => self.ipv4_ext.as_ref().map(|v| &v[..]),
            Layer::Ipv6 => self.ipv6.as_ref().map(|v| &v[..]),
            Layer::Tcp => self.tcp.as_ref().map(|v| &v[..]),
            Layer::Udp => self.udp.as_ref().map(|v| &v[..]),
        }
    }

    fn matches(&self, s: &FlowSpec) -> bool {
        let Some(have) = self.layer(s.layer) else { return false };
        have.iter().zip(&s.value).zip(&s.mask).all(|((h, v), m)| h & m == v & m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DST: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
    const SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 2];

    /// An Ethernet/IPv4/UDP frame from 10.0.0.2:5000 to 10.0.0.1:6000.
    fn udp_frame() -> Vec<u8> {
        let mut f = [DST, SRC].concat();
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f.extend_from_slice(&[0x45, 0x08, 0, 28, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 2, 10, 0, 0, 1]);
        f.extend_from_slice(&[0x13, 0x88, 0x17, 0x70, 0, 8, 0, 0]);
        f
    }

    fn spec(layer: Layer, value: &[u8], mask: &[u8]) -> FlowSpec {
        FlowSpec { layer, value: value.to_vec(), mask: mask.to_vec() }
    }

    fn normal(priority: u16, specs: Vec<FlowSpec>) -> FlowRule {
        FlowRule { kind: FlowKind::Normal, priority, specs }
    }

    #[test]
    fn each_layer_matches_its_fields_under_its_mask() {
        let f = udp_frame();
        let mut t = FlowTable::default();
        let eth = [DST, [0; 6]].concat().into_iter().chain([8, 0, 0, 0]).collect::<Vec<u8>>();
        let eth_mask = [[0xff; 6], [0; 6]].concat().into_iter().chain([0xff, 0xff, 0, 0]).collect::<Vec<u8>>();
        t.add(1, normal(0, vec![spec(Layer::Eth, &eth, &eth_mask)])).unwrap();
        assert_eq!(t.targets(&f), vec![1]);
        let mut t = FlowTable::default();
        let ip = [10, 0, 0, 2, 10, 0, 0, 1, 17, 0, 0, 0];
        t.add(2, normal(0, vec![spec(Layer::Ipv4Ext, &ip, &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0, 0, 0])]))
            .unwrap();
        let ports = [0x17, 0x70, 0x13, 0x88];
        t.add(3, normal(0, vec![spec(Layer::Tcp, &ports, &[0xff; 4])])).unwrap();
        assert_eq!(t.targets(&f), vec![2], "a TCP spec does not match a UDP frame");
        let mut t = FlowTable::default();
        t.add(4, normal(0, vec![spec(Layer::Udp, &ports, &[0xff; 4])])).unwrap();
        assert_eq!(t.targets(&f), vec![4]);
        let mut wrong = ports;
        wrong[0] ^= 1;
        let mut t = FlowTable::default();
        t.add(5, normal(0, vec![spec(Layer::Udp, &wrong, &[0xff; 4])])).unwrap();
        assert!(t.targets(&f).is_empty());
        t.add(6, normal(0, vec![spec(Layer::Ipv6, &[0; 39], &[0; 39])])).unwrap();
        assert!(t.targets(&f).is_empty(), "an IPv6 spec wants an IPv6 frame, whatever its mask");
    }

    #[test]
    fn the_lowest_priority_value_steers_defaults_take_the_rest_and_sniffers_see_all() {
        let f = udp_frame();
        let any = || vec![spec(Layer::Eth, &[0; 16], &[0; 16])];
        let mut t = FlowTable::default();
        t.add(9, FlowRule { kind: FlowKind::AllDefault, priority: 0, specs: vec![] }).unwrap();
        assert_eq!(t.targets(&f), vec![9]);
        t.add(7, normal(3, any())).unwrap();
        let high = t.add(8, normal(1, any())).unwrap();
        t.add(10, FlowRule { kind: FlowKind::Sniffer, priority: 0, specs: vec![] }).unwrap();
        assert_eq!(t.targets(&f), vec![8, 10]);
        assert!(t.remove(high) && !t.remove(high));
        assert_eq!(t.targets(&f), vec![7, 10]);
        t.forget_qp(7);
        assert_eq!(t.targets(&f), vec![9, 10]);
    }

    #[test]
    fn vlan_tags_and_short_frames() {
        let mut f = udp_frame();
        f.splice(12..12, [0x81, 0x00, 0x20, 0x05]);
        let mut t = FlowTable::default();
        let mut v = [0u8; 16];
        v[12..16].copy_from_slice(&[0x08, 0x00, 0x00, 0x05]);
        let mut m = [0u8; 16];
        m[12..16].copy_from_slice(&[0xff, 0xff, 0x0f, 0xff]);
        t.add(1, normal(0, vec![spec(Layer::Eth, &v, &m)])).unwrap();
        assert_eq!(t.targets(&f), vec![1], "the EtherType after the tag, the VLAN ID in the TCI");
        assert!(t.targets(&f[..13]).is_empty());
        assert!(t.targets(&[]).is_empty());
    }

    /// The verification suite of Microsoft's RSS specification: its key, and the IPv4
    /// address pairs (source 66.9.149.187, destination 161.142.100.80) and ports.
    #[test]
    fn toeplitz_matches_the_rss_specification() {
        let key = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0, 0xca,
            0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b,
            0xbe, 0xac, 0x01, 0xfa,
        ];
        assert_eq!(toeplitz(&key, &[66, 9, 149, 187, 161, 142, 100, 80]), 0x323e8fc2);
        assert_eq!(toeplitz(&key, &[66, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6]), 0x51ccc178);
    }

    #[test]
    fn rx_hash_spreads_by_source_address_and_keeps_a_flow_on_one_queue() {
        let wq = |i| WorkQueue { srq: i, cq: i, pd: crate::engine::mem::Pd(1) };
        let h = RxHash { key: vec![0x5a; 40], fields: HASH_SRC_IPV4 | HASH_DST_IPV4, table: (0..8).map(wq).collect() };
        let mut seen = std::collections::HashSet::new();
        for src in 0..32u8 {
            let mut f = udp_frame();
            f[26..30].copy_from_slice(&[src, src + 1, src + 2, src + 3]);
            let picked = h.pick(&f).unwrap();
            assert_eq!(h.pick(&f), Some(picked), "one flow, one queue");
            seen.insert(picked.srq);
        }
        assert!(seen.len() > 1, "32 sources over 8 queues use more than one");
        assert_eq!(h.pick(&[0; 4]), None);
    }

    #[test]
    fn rules_are_bounded_and_well_formed() {
        let mut t = FlowTable::default();
        assert_eq!(t.add(1, normal(0, vec![spec(Layer::Udp, &[0; 3], &[0; 3])])), Err(FlowError::Malformed));
        for _ in 0..MAX_FLOWS {
            t.add(1, normal(0, vec![])).unwrap();
        }
        assert_eq!(t.add(1, normal(0, vec![])), Err(FlowError::TooMany));
        assert_eq!(t.len(), MAX_FLOWS);
    }
}
