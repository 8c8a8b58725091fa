//! RoCEv2 on kernel UDP sockets between network namespaces joined by a veth pair: what
//! loopback cannot show. Multicast over IPv6 (loopback has no multicast): a UD datagram to
//! DestQP 0xFFFFFF at an IPv6 group reaches the QP attached to it on the other end (IBTA
//! 10.5; the group's GID is its IPv6 address). Needs root; each test makes and removes its
//! own namespaces.

mod netns;
mod rc_pair;

use netns::pair_or_skip;
use rc_pair::*;
use softrdma::transport::headers::ip_to_gid;
use softrdma::verbs::*;
use std::net::IpAddr;

#[test]
fn a_multicast_datagram_crosses_an_ipv6_link_to_the_attached_qp() {
    let Some(pair) = pair_or_skip("ipv6 multicast") else { return };
    let addrs = ["fd00:9::1", "fd00:9::2"];
    for (i, a) in addrs.iter().enumerate() {
        // No duplicate address detection: the address is usable at once.
        let cidr = format!("{a}/64");
        let st = std::process::Command::new("ip")
            .args(["-n", &pair.ns[i], "addr", "add", &cidr, "dev", &pair.ifaces[i], "nodad"])
            .status()
            .expect("ip");
        assert!(st.success(), "address {cidr}");
    }
    let open = |i: usize| {
        let mut cfg = OpenConfig::new(addrs[i].parse().unwrap());
        cfg.seed = Some(i as u64 + 1);
        side(open_in(&pair, i, cfg), 1 << 16)
    };
    let (a, b) = (open(0), open(1));
    let group: IpAddr = "ff0e::9:1".parse().unwrap();
    let mgid = ip_to_gid(group);
    let (qa, _ca) = ud_qp(&a, RDMA_UDP_QKEY);
    let (qb, cb) = ud_qp(&b, RDMA_UDP_QKEY);
    // The group's socket is made by the calling thread, in its namespace: B's.
    pair.scoped_in(1, || qb.attach_mcast(mgid)).unwrap();
    qb.post_recv(RecvWr { wr_id: 7, sgl: vec![b.mr.sge(0, 40 + 64)] }).unwrap();
    let wc = multicast_arrives(&a, &qa, &b, &cb, mgid, b"to an IPv6 group");
    assert_eq!(wc.src_gid, Some(ip_to_gid(addrs[0].parse().unwrap())), "from A's address");
    assert_eq!(b.ctx.stats().rx_icrc_bad, 0, "the ICRC holds over the IPv6 header the kernel built");
}
