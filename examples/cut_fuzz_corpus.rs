//! Cuts the fuzz seed corpora in `fuzz/corpus/` out of the captures in `pcaps/linux/`:
//! RoCEv2 UDP payloads, CM MADs, whole MPA streams (one direction each) and DDP segments;
//! and for the stateful targets: each capture's RoCEv2 packets in order as one device input,
//! each datagram with its addresses for the UDP receive check, each stream's FPDUs for an
//! iWARP QP and its MPA frame for MPA setup.
//!
//! Run from the repository root: `cargo run --example cut_fuzz_corpus`.

use softrdma::capture::frame::{dissect, Dissected};
use softrdma::capture::reader::read_frames;
use softrdma::proto::iwarp::fpdu::FpduPacket;
use softrdma::proto::iwarp::mpa::MpaFramePacket;
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::Path;

const MAX_STREAM_BYTES: usize = 8192;
/// Packets of one capture in one `roce_device` input.
const DEVICE_PACKETS: usize = 48;

fn save(target: &str, name: &str, bytes: &[u8], seen: &mut HashSet<Vec<u8>>) {
    if !seen.insert(bytes.to_vec()) {
        return;
    }
    let dir = Path::new("fuzz/corpus").join(target);
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::fs::write(dir.join(name), bytes).expect("write");
}

fn main() {
    let mut seen = HashSet::new();
    let mut names: Vec<_> =
        std::fs::read_dir("pcaps/linux").expect("pcaps/linux").flatten().map(|e| e.path()).collect();
    names.sort();
    for path in names {
        let stem = path.file_stem().unwrap().to_string_lossy().to_string();
        let frames = read_frames(&std::fs::read(&path).unwrap()).expect("capture");
        let mut streams: BTreeMap<String, (u32, Vec<u8>)> = BTreeMap::new();
        let (mut device_input, mut device_packets) = (Vec::new(), 0);
        for f in &frames.frames {
            match dissect(f) {
                Dissected::Udp(d) if d.dst_port == 4791 => {
                    save("roce_packet", &format!("{stem}-{:04}", f.number), d.payload, &mut seen);
                    if let (IpAddr::V4(s), IpAddr::V4(t)) = (d.src, d.dst) {
                        let mut u = [s.octets(), t.octets()].concat();
                        u.push(d.ecn);
                        u.extend_from_slice(&d.udp_header[..2]);
                        u.extend_from_slice(d.payload);
                        save("udp_receive", &format!("{stem}-{:04}", f.number), &u, &mut seen);
                    }
                    if device_packets < DEVICE_PACKETS && d.payload.len() >= 12 {
                        device_packets += 1;
                        // The QP of the packet's transport: RC, UC, or UD (IBTA Table 38).
                        device_input.push([0u8, 1, 3, 2, 3, 3, 3, 3][usize::from(d.payload[0] >> 5)]);
                        device_input.extend_from_slice(&(d.payload.len() as u16).to_be_bytes());
                        device_input.extend_from_slice(d.payload);
                    }
                    if d.payload.len() == 12 + 8 + 256 + 4 {
                        save("cm_mad", &format!("{stem}-{:04}", f.number), &d.payload[20..276], &mut seen);
                    }
                }
                Dissected::Tcp(t) => {
                    let key = format!("{stem}-{}-{}", t.src.1, t.dst.1);
                    let s = streams.entry(key).or_insert((t.seq.wrapping_add(1), Vec::new()));
                    if t.syn {
                        *s = (t.seq.wrapping_add(1), Vec::new());
                    } else if t.seq == s.0.wrapping_add(s.1.len() as u32) && s.1.len() < MAX_STREAM_BYTES {
                        s.1.extend_from_slice(t.payload);
                    }
                }
                _ => {}
            }
        }
        if device_packets > 0 {
            save("roce_device", &stem, &device_input, &mut seen);
        }
        for (key, (_, data)) in streams {
            let Ok(mpa) = MpaFramePacket::new_checked(&data[..]) else {
                continue;
            };
            let crc = mpa.flags() & 0x40 != 0;
            let mut seed = vec![if crc { 0x02 | (7 << 2) } else { 13 << 2 }];
            seed.extend_from_slice(&data);
            save("mpa_stream", &key, &seed, &mut seen);
            // The peer's frame to a responder (a Request) or to an initiator (a Reply), and
            // the FPDUs after it to a QP with the same CRC, in 212-byte pieces.
            let role: u8 = if data[..16] == softrdma::proto::iwarp::mpa::KEY_REQUEST[..] { 2 } else { 0 };
            let mut setup = vec![1 | (role << 5) | 128];
            setup.extend_from_slice(&data[..mpa.frame_len()]);
            save("mpa_setup", &key, &setup, &mut seen);
            let mut qp = vec![if crc { 2 | (1 << 5) } else { 1 << 5 }];
            qp.extend_from_slice(&data[mpa.frame_len()..]);
            save("iwarp_qp", &key, &qp, &mut seen);
            let mut rest = &data[mpa.frame_len()..];
            let mut i = 0;
            while let Ok(f) = FpduPacket::new_checked(rest) {
                save("ddp_rdmap", &format!("{key}-{i:03}"), f.ulpdu(), &mut seen);
                rest = &rest[f.total_len()..];
                i += 1;
            }
        }
    }
    let all =
        ["roce_packet", "cm_mad", "mpa_stream", "ddp_rdmap", "roce_device", "udp_receive", "iwarp_qp", "mpa_setup"];
    for t in all {
        let n = std::fs::read_dir(Path::new("fuzz/corpus").join(t)).map(|d| d.count()).unwrap_or(0);
        println!("{t}: {n} seeds");
    }
}
