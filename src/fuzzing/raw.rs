//! The raw device's receive check fed arbitrary frames: `frame::classify` for an IPv4 and an
//! IPv6 device, and what it learns fed to a neighbour table.

use crate::transport::raw::frame::{classify, Inbound, Local};
use crate::transport::raw::neighbour::{Neighbours, MAX_NEIGHBOURS};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

const V4: Local = Local { mac: [0x02, 0x5e, 10, 9, 0, 2], ip: IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2)) };
const V6: Local = Local { mac: [0x02, 0x5e, 0, 0, 0, 2], ip: IpAddr::V6(Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 2)) };

/// Oracles: no panic; a RoCEv2 packet handed on lies inside the frame; every reply is a
/// whole Ethernet frame from the device's MAC; the neighbour table stays bounded.
pub fn raw_frame(data: &[u8]) {
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
                Inbound::Echo(r) => assert!(r.len() >= 60 && r[6..12] == local.mac, "an echo from the device's MAC"),
                Inbound::Dropped(_) => {}
            }
        }
    }
    assert!(table.len() <= MAX_NEIGHBOURS);
}
