//! iWARP on a byte stream: MPA deframing (RFC 5044).

pub mod deframer;
