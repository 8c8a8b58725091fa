//! Registered memory's copy-in/copy-out against a plain byte array, at every alignment.

use proptest::prelude::*;
use softrdma::engine::mem::SharedMem;

proptest! {
    #[test]
    fn writes_and_reads_match_a_byte_array(
        len in 0usize..200,
        ops in prop::collection::vec((0usize..220, prop::collection::vec(any::<u8>(), 0..64)), 1..20),
    ) {
        let mem = SharedMem::new(len);
        let mut model = vec![0u8; len];
        for (off, data) in ops {
            let fits = off + data.len() <= len;
            prop_assert_eq!(mem.write(off, &data), fits);
            if fits {
                model[off..off + data.len()].copy_from_slice(&data);
            }
            let mut back = vec![0u8; data.len()];
            prop_assert_eq!(mem.read(off, &mut back), fits);
            if fits {
                prop_assert_eq!(&back, &data);
            }
        }
        prop_assert_eq!(mem.to_vec(), model);
    }
}
