//! iWARP: MPA (RFC 5044, RFC 6581) over TCP, DDP (RFC 5041) and RDMAP (RFC 5040).
//!
//! On a TCP connection the initiator sends an [`mpa`] Request frame, the responder an
//! [`mpa`] Reply; from then on the stream is a sequence of [`fpdu`]s, each carrying one DDP
//! segment ([`ddp`]) whose RDMAP control byte and body are described in [`rdmap`].

pub mod ddp;
pub mod fpdu;
pub mod mpa;
pub mod rdmap;
