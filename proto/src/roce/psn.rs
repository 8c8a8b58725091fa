//! 24-bit packet sequence numbers with serial arithmetic (IBTA 9.7.1).

use core::cmp::Ordering;
use core::fmt;

/// A 24-bit PSN. Arithmetic wraps at 2^24; ordering is serial (RFC 1982 style): `a` is
/// before `b` when `b - a mod 2^24` is in `1..2^23`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// The PSN space is 24 bits wide.
    pub const MASK: u32 = 0x00ff_ffff;
    /// Half the PSN space: the largest distance that still has a direction.
    pub const HALF: u32 = 0x0080_0000;

    /// Makes a PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Psn {
        Psn(v & Self::MASK)
    }
    /// The PSN as a number in `0..2^24`.
    pub const fn value(self) -> u32 {
        self.0
    }
    /// `self + n`, wrapping at 2^24.
    pub const fn add(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_add(n))
    }
    /// `self - n`, wrapping at 2^24.
    pub const fn sub(self, n: u32) -> Psn {
        Psn::new(self.0.wrapping_sub(n))
    }
    /// The next PSN.
    pub const fn next(self) -> Psn {
        self.add(1)
    }
    /// Signed distance from `self` to `later`, in `-2^23..2^23`.
    pub const fn distance_to(self, later: Psn) -> i32 {
        let d = later.0.wrapping_sub(self.0) & Self::MASK;
        if d >= Self::HALF {
            d as i32 - (1 << 24)
        } else {
            d as i32
        }
    }
    /// Serial comparison: `Less` when `self` comes before `other`.
    pub fn serial_cmp(self, other: Psn) -> Ordering {
        self.distance_to(other).cmp(&0).reverse()
    }
    /// True when `self` lies in the window `[start, start + len)` (mod 2^24).
    pub const fn in_window(self, start: Psn, len: u32) -> bool {
        (self.0.wrapping_sub(start.0) & Self::MASK) < len
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:06x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_24_bits() {
        assert_eq!(Psn::new(0xff_ffff).next(), Psn::new(0));
        assert_eq!(Psn::new(0).sub(1), Psn::new(0xff_ffff));
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
    }

    #[test]
    fn distance_and_order_across_the_wrap() {
        let a = Psn::new(0xff_fffe);
        let b = Psn::new(3);
        assert_eq!(a.distance_to(b), 5);
        assert_eq!(b.distance_to(a), -5);
        assert_eq!(a.serial_cmp(b), Ordering::Less);
        assert_eq!(b.serial_cmp(a), Ordering::Greater);
        assert_eq!(a.serial_cmp(a), Ordering::Equal);
        assert_eq!(Psn::new(0).distance_to(Psn::new(Psn::HALF)), -(1 << 23));
    }

    #[test]
    fn window_membership() {
        let start = Psn::new(0xff_fff0);
        assert!(Psn::new(0xff_fff0).in_window(start, 32));
        assert!(Psn::new(0x00_000f).in_window(start, 32));
        assert!(!Psn::new(0x00_0010).in_window(start, 32));
        assert!(!Psn::new(0xff_ffef).in_window(start, 32));
    }

    proptest::proptest! {
        #[test]
        fn distance_inverts_add(a in 0u32..(1 << 24), n in 0u32..Psn::HALF) {
            let p = Psn::new(a);
            proptest::prop_assert_eq!(p.distance_to(p.add(n)), n as i32);
            proptest::prop_assert_eq!(p.add(n).sub(n), p);
        }
    }
}
