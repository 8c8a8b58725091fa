//! The raw device's receive check fed arbitrary frames: `frame::classify` for an IPv4 and an
//! IPv6 device, and what it learns fed to a neighbour table; a packet socket's split of a
//! GSO send into frames; and raw packet QPs' flow
//! steering and receive-side scaling, which see every frame the device does not take.

use crate::engine::mem::Pd;
use crate::engine::raw::{FlowKind, FlowRule, FlowSpec, FlowTable, Layer, RxHash, WorkQueue};
use crate::transport::raw::frame::{classify, Inbound, Local};
use crate::transport::raw::gso::{
    merge_udp_run, split_udp_gso, udp_gso_segment_bytes, udp_run_len, Segments, GSO_SEGMENTS_MAX, MERGE_FRAMES_MAX,
};
use crate::transport::raw::neighbour::{Neighbours, MAX_NEIGHBOURS};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const V4: Local = Local { mac: [0x02, 0x5e, 10, 9, 0, 2], ip: IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2)) };
const V6: Local = Local { mac: [0x02, 0x5e, 0, 0, 0, 2], ip: IpAddr::V6(Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 2)) };

/// Rules on every layer, steering to QPs 1 to 7, with half-open masks.
fn rules() -> FlowTable {
    let mut t = FlowTable::default();
    let layers = [Layer::Eth, Layer::Ipv4, Layer::Ipv4Ext, Layer::Ipv6, Layer::Tcp, Layer::Udp];
    for (i, layer) in layers.into_iter().enumerate() {
        let n = layer.filter_len();
        let spec =
            FlowSpec { layer, value: vec![0; n], mask: (0..n).map(|k| if k % 2 == 0 { 0 } else { 0x0f }).collect() };
        let rule = FlowRule { kind: FlowKind::Normal, priority: i as u16, specs: vec![spec] };
        t.add(i as u32 + 1, rule).expect("well formed");
    }
    t.add(7, FlowRule { kind: FlowKind::Sniffer, priority: 0, specs: vec![] }).expect("well formed");
    t
}

/// Oracles: no panic; a RoCEv2 packet handed on lies inside the frame; every reply is a
/// whole Ethernet frame from the device's MAC; the neighbour table stays bounded; a frame
/// goes only to QPs that have rules, the sniffer always, and RSS picks a table entry.
pub fn raw_frame(data: &[u8]) {
    let flows = rules();
    let wq = |i| WorkQueue { srq: i, cq: i, pd: Pd(1) };
    let rss =
        RxHash { key: data.iter().take(40).copied().collect(), fields: u64::MAX, table: (1..=5).map(wq).collect() };
    for frame in data.chunks(512) {
        let to = flows.targets(frame);
        assert!(to.iter().all(|q| (1..=7).contains(q)), "only QPs with rules: {to:?}");
        // A frame shorter than its link header (Ethernet, and the VLAN tag it announces)
        // goes nowhere; every other one reaches the sniffer.
        let link_len = if frame.get(12..14) == Some(&[0x81, 0x00]) { 18 } else { 14 };
        assert!(frame.len() < link_len || to.contains(&7), "the sniffer sees every frame");
        if let Some(w) = rss.pick(frame) {
            assert!(rss.table.contains(&w));
        }
    }
    let mut table = Neighbours::default();
    // Each 512-byte piece of the input is one frame, so that one input teaches many.
    for (i, frame) in data.chunks(512).enumerate() {
        for local in [V4, V6] {
            match classify(&local, frame) {
                Inbound::Roce { packet, .. } => {
                    let inside = frame.as_ptr_range();
                    assert!(
                        inside.contains(&packet.as_ptr()) || packet.is_empty(),
                        "the packet is the frame's own bytes"
                    );
                    assert!(packet.len() <= frame.len());
                }
                Inbound::Neighbour { learned, reply } => {
                    if let Some(r) = reply {
                        assert!(r.len() >= 60 && r[6..12] == local.mac, "a reply from the device's MAC");
                    }
                    if let Some((ip, mac)) = learned {
                        let _ = table.learn(ip, mac, i as u64);
                    }
                }
                Inbound::Advertised { ip, mac } => {
                    let _ = table.update(ip, mac, i as u64);
                }
                Inbound::RoceMulticast { group, packet, .. } => {
                    assert!(group.is_multicast() && packet.len() <= frame.len());
                }
                Inbound::Echo(r) => assert!(r.len() >= 60 && r[6..12] == local.mac, "an echo from the device's MAC"),
                Inbound::Dropped(_) => {}
            }
        }
    }
    assert!(table.len() <= MAX_NEIGHBOURS);
    gso_split(data);
}

/// Oracles for a packet socket's split of a GSO send ([`split_udp_gso`]): at most
/// [`GSO_SEGMENTS_MAX`] frames, none longer than the frame they came from, each one the
/// device's receive check takes without a panic.
fn gso_split(data: &[u8]) {
    let mut out = Segments::default();
    for frame in data.chunks(512) {
        // The segment size is the frame's first byte (and 1 to 256), so inputs reach it.
        let size = usize::from(frame.first().copied().unwrap_or(0)) + 1;
        out.clear();
        let n = split_udp_gso(frame, size, &mut out);
        assert!(n <= GSO_SEGMENTS_MAX && out.len() == n);
        for k in 0..n {
            let piece = out.get(k).expect("each frame split");
            assert!(piece.len() <= frame.len(), "headers and one datagram, within the frame");
            let _ = classify(&V4, piece);
        }
    }
    // The frames as a run to send: what merges into one GSO send splits back into the
    // same frames, payloads and all.
    let frames: Vec<&[u8]> = data.chunks(512).collect();
    let n = udp_run_len(&frames);
    assert!(n <= frames.len().min(MERGE_FRAMES_MAX));
    if n >= 2 {
        let mut merged = Vec::new();
        let vnet = merge_udp_run(&frames[..n], &mut merged);
        let size = udp_gso_segment_bytes(&vnet).expect("a UDP GSO header");
        out.clear();
        assert_eq!(split_udp_gso(&merged, size, &mut out), n, "splits into the frames merged");
        for (k, f) in frames[..n].iter().enumerate() {
            let piece = out.get(k).expect("each frame");
            // Same length, same last payload byte (every merged frame has a payload).
            assert_eq!((piece.len(), piece.last()), (f.len(), f.last()), "frame {k}");
        }
    }
}
