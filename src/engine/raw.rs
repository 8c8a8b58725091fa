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
        let Some(f) = Fields::of(frame) else { return Vec::new() };
        let matching = || self.rules.values().filter(|(_, r)| r.specs.iter().all(|s| f.matches(s)));
        let steered =
            matching().filter(|(_, r)| r.kind == FlowKind::Normal).min_by_key(|(_, r)| r.priority).map(|&(q, _)| q);
        let multicast = frame[0] & 1 == 1;
        let mut out: Vec<u32> = match steered {
            Some(q) => vec![q],
            None => matching()
                .filter(|(_, r)| r.kind == FlowKind::AllDefault || (multicast && r.kind == FlowKind::McDefault))
                .map(|&(q, _)| q)
                .collect(),
        };
        out.extend(matching().filter(|(_, r)| r.kind == FlowKind::Sniffer).map(|&(q, _)| q));
        out.sort_unstable();
        out.dedup();
        out
    }
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
