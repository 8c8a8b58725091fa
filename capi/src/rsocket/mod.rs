//! rsockets (`rdma/rsocket.h`): stream sockets over RDMA, wire-compatible with
//! librdmacm's, so that `rstream`, `rcopy` and applications preloading `librspreload`
//! run on softrdma and talk to rsockets on rxe, siw or a NIC.

pub mod flow;
pub mod wire;

#[cfg(test)]
mod flow_tests;
