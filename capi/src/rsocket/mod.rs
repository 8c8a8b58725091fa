//! rsockets (`rdma/rsocket.h`): stream sockets over RDMA, wire-compatible with
//! librdmacm's, so that `rstream`, `rcopy` and applications preloading `librspreload`
//! run on softrdma and talk to rsockets on rxe, siw or a NIC; and datagram sockets over
//! UD in librdmacm's datagram protocol (`udpong`), which librdmacm itself offers on
//! InfiniBand only (its address handle to the socket's own QP has no GRH, which RoCE
//! needs).

pub mod api;
mod completions;
mod dgram;
mod dgram_api;
mod dgram_qp;
pub mod dgram_wire;
mod endpoint;
pub mod flow;
pub mod socket;
pub mod wire;

std::arch::global_asm!(
    ".symver rsocket, rsocket@@RDMACM_1.0",
    ".symver rbind, rbind@@RDMACM_1.0",
    ".symver rlisten, rlisten@@RDMACM_1.0",
    ".symver raccept, raccept@@RDMACM_1.0",
    ".symver rconnect, rconnect@@RDMACM_1.0",
    ".symver rshutdown, rshutdown@@RDMACM_1.0",
    ".symver rclose, rclose@@RDMACM_1.0",
    ".symver rrecv, rrecv@@RDMACM_1.0",
    ".symver rrecvfrom, rrecvfrom@@RDMACM_1.0",
    ".symver rrecvmsg, rrecvmsg@@RDMACM_1.0",
    ".symver rsend, rsend@@RDMACM_1.0",
    ".symver rsendto, rsendto@@RDMACM_1.0",
    ".symver rsendmsg, rsendmsg@@RDMACM_1.0",
    ".symver rread, rread@@RDMACM_1.0",
    ".symver rreadv, rreadv@@RDMACM_1.0",
    ".symver rwrite, rwrite@@RDMACM_1.0",
    ".symver rwritev, rwritev@@RDMACM_1.0",
    ".symver rpoll, rpoll@@RDMACM_1.0",
    ".symver rselect, rselect@@RDMACM_1.0",
    ".symver rgetpeername, rgetpeername@@RDMACM_1.0",
    ".symver rgetsockname, rgetsockname@@RDMACM_1.0",
    ".symver rsetsockopt, rsetsockopt@@RDMACM_1.0",
    ".symver rgetsockopt, rgetsockopt@@RDMACM_1.0",
    ".symver rfcntl, rfcntl@@RDMACM_1.0",
    ".symver riomap, riomap@@RDMACM_1.0",
    ".symver riounmap, riounmap@@RDMACM_1.0",
    ".symver riowrite, riowrite@@RDMACM_1.0",
);

#[cfg(test)]
mod flow_tests;
