//! The command-line tools: perftest-style benchmarks, ibv_rc_pingpong, and the demo.

pub mod bench;
pub mod demo;
pub mod demo_iwarp;
pub mod demo_veth;
pub mod netns;
pub mod oob;
pub mod perf;
pub mod pingpong;
pub mod rping;
pub mod udp_bw;
pub mod udp_lat;
