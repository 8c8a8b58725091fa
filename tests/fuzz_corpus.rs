//! Replays every seed and every saved crash of the fuzz targets on the stable toolchain,
//! so CI checks them without nightly: `fuzz/corpus/<target>/*` and `fuzz/regressions/<target>/*`.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries.flatten() {
            let bytes = std::fs::read(e.path()).expect("read seed");
            run(&bytes);
            n += 1;
        }
    }
    n
}

#[test]
fn roce_packet_corpus() {
    assert!(replay("roce_packet", softrdma::fuzzing::roce_packet) >= 200);
}

#[test]
fn mpa_stream_corpus() {
    assert!(replay("mpa_stream", softrdma::fuzzing::mpa_stream) >= 10);
}

#[test]
fn ddp_rdmap_corpus() {
    assert!(replay("ddp_rdmap", softrdma::fuzzing::ddp_rdmap) >= 50);
}

#[test]
fn cm_mad_corpus() {
    assert!(replay("cm_mad", softrdma::fuzzing::cm_mad) >= 5);
}

#[test]
fn roce_device_corpus() {
    assert!(replay("roce_device", softrdma::fuzzing::roce_device) >= 4);
}

#[test]
fn udp_receive_corpus() {
    assert!(replay("udp_receive", softrdma::fuzzing::udp_receive) >= 200);
}

#[test]
fn iwarp_qp_corpus() {
    assert!(replay("iwarp_qp", softrdma::fuzzing::iwarp_qp) >= 10);
}

#[test]
fn mpa_setup_corpus() {
    assert!(replay("mpa_setup", softrdma::fuzzing::mpa_setup) >= 8);
}

#[test]
fn raw_frame_corpus() {
    assert!(replay("raw_frame", softrdma::fuzzing::raw_frame) >= 8);
}
