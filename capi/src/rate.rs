//! Static rates (`enum ibv_rate`, IBTA 9.11 / table 226 "StaticRate"): as multiples of
//! 2.5 Gb/s and in Mb/s after line encoding, both ways, as rdma-core converts them.

use crate::ffi;
use std::ffi::c_int;

/// Each rate, its multiple of 2.5 Gb/s (-1: not a multiple) and its Mb/s.
const RATES: [(ffi::ibv_rate, c_int, c_int); 23] = [
    (ffi::IBV_RATE_2_5_GBPS, 1, 2500),
    (ffi::IBV_RATE_5_GBPS, 2, 5000),
    (ffi::IBV_RATE_10_GBPS, 4, 10000),
    (ffi::IBV_RATE_20_GBPS, 8, 20000),
    (ffi::IBV_RATE_30_GBPS, 12, 30000),
    (ffi::IBV_RATE_40_GBPS, 16, 40000),
    (ffi::IBV_RATE_60_GBPS, 24, 60000),
    (ffi::IBV_RATE_80_GBPS, 32, 80000),
    (ffi::IBV_RATE_120_GBPS, 48, 120000),
    (ffi::IBV_RATE_14_GBPS, -1, 14062),
    (ffi::IBV_RATE_56_GBPS, -1, 56250),
    (ffi::IBV_RATE_112_GBPS, -1, 112500),
    (ffi::IBV_RATE_168_GBPS, -1, 168750),
    (ffi::IBV_RATE_25_GBPS, -1, 25781),
    (ffi::IBV_RATE_100_GBPS, -1, 103125),
    (ffi::IBV_RATE_200_GBPS, -1, 206250),
    (ffi::IBV_RATE_300_GBPS, -1, 309375),
    (ffi::IBV_RATE_28_GBPS, 11, 28125),
    (ffi::IBV_RATE_50_GBPS, 20, 53125),
    (ffi::IBV_RATE_400_GBPS, 160, 425000),
    (ffi::IBV_RATE_600_GBPS, 240, 637500),
    (ffi::IBV_RATE_800_GBPS, 320, 850000),
    (ffi::IBV_RATE_1200_GBPS, 480, 1275000),
];

/// `ibv_rate_to_mult`: -1 for a rate that is no multiple of 2.5 Gb/s.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.1)
}

/// `mult_to_ibv_rate`: `IBV_RATE_MAX` for a multiple no rate has.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> ffi::ibv_rate {
    RATES.iter().find(|r| r.1 == mult && mult > 0).map_or(ffi::IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps`: -1 for an unknown rate.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: ffi::ibv_rate) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: `IBV_RATE_MAX` for a speed no rate has.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> ffi::ibv_rate {
    RATES.iter().find(|r| r.2 == mbps).map_or(ffi::IBV_RATE_MAX, |r| r.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_convert_both_ways() {
        assert_eq!(ibv_rate_to_mult(ffi::IBV_RATE_40_GBPS), 16);
        assert_eq!(mult_to_ibv_rate(16), ffi::IBV_RATE_40_GBPS);
        assert_eq!(ibv_rate_to_mult(ffi::IBV_RATE_100_GBPS), -1, "EDR is no multiple of 2.5");
        assert_eq!(ibv_rate_to_mbps(ffi::IBV_RATE_100_GBPS), 103125);
        assert_eq!(mbps_to_ibv_rate(103125), ffi::IBV_RATE_100_GBPS);
        assert_eq!(mult_to_ibv_rate(-1), ffi::IBV_RATE_MAX);
        assert_eq!(mbps_to_ibv_rate(12345), ffi::IBV_RATE_MAX);
        assert_eq!(ibv_rate_to_mbps(ffi::IBV_RATE_MAX), -1);
    }
}
