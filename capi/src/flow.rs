//! `ibv_create_flow` / `ibv_destroy_flow` (through `verbs_context`): flow rules that steer
//! the frames a device's raw packet QPs send to a raw packet QP (softrdma's engine,
//! `engine::raw`). The specs follow the `ibv_flow_attr` in memory, each starting with its
//! type and size; their filters are in network byte order.

use crate::device::soft_context;
use crate::ffi;
use crate::qp::soft_qp;
use softrdma::engine::raw::{FlowKind, FlowRule, FlowSpec, Layer, MAX_SPECS_PER_FLOW};
use softrdma::verbs::VerbsError;
use std::ffi::c_int;
use std::mem::size_of;

/// An `ibv_flow` and the engine's rule id (its `handle`).
#[repr(C)]
struct SoftFlow {
    ibv: ffi::ibv_flow,
}

fn fail(errno: c_int) -> *mut ffi::ibv_flow {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = errno };
    std::ptr::null_mut()
}

/// The `ibv_create_flow` operation.
///
/// # Safety
/// `qp` is a live QP of this library; `attr` is followed in memory by its specs.
pub unsafe extern "C" fn create_flow(qp: *mut ffi::ibv_qp, attr: *mut ffi::ibv_flow_attr) -> *mut ffi::ibv_flow {
    // SAFETY: the caller's contract.
    let (Some(sq), Some(a)) = (unsafe { soft_qp(qp) }, unsafe { attr.as_ref() }) else { return fail(libc::EINVAL) };
    // SAFETY: as above: the specs follow the attribute.
    let rule = match unsafe { rule_of(a) } {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    match sq.qp.create_flow(rule) {
        Ok(handle) => {
            let ibv = ffi::ibv_flow { comp_mask: 0, context: sq.ibv().context, handle };
            Box::into_raw(Box::new(SoftFlow { ibv })).cast()
        }
        Err(VerbsError::Unsupported) => fail(libc::EOPNOTSUPP),
        Err(VerbsError::QueueFull) => fail(libc::ENOMEM),
        Err(_) => fail(libc::EINVAL),
    }
}

/// The `ibv_destroy_flow` operation.
///
/// # Safety
/// `flow` came from [`create_flow`] and is not destroyed.
pub unsafe extern "C" fn destroy_flow(flow: *mut ffi::ibv_flow) -> c_int {
    if flow.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by create_flow as a boxed SoftFlow, handed back once.
    let f = unsafe { Box::from_raw(flow.cast::<SoftFlow>()) };
    // SAFETY: the flow's context is open while the application holds the flow.
    let Some(soft) = (unsafe { soft_context(f.ibv.context) }) else { return libc::EINVAL };
    let Ok(engine) = soft.engine() else { return libc::EIO };
    // A rule whose QP was destroyed went with it: the flow is gone either way.
    match engine.destroy_flow(f.ibv.handle) {
        Ok(()) | Err(VerbsError::NotFound) => 0,
        Err(_) => libc::EINVAL,
    }
}

/// The rule an `ibv_flow_attr` and its specs describe.
///
/// # Safety
/// `a.num_of_specs` specs follow `a` in memory, each at least as long as its `size`.
unsafe fn rule_of(a: &ffi::ibv_flow_attr) -> Result<FlowRule, c_int> {
    let kind = match a.type_ {
        ffi::IBV_FLOW_ATTR_NORMAL => FlowKind::Normal,
        ffi::IBV_FLOW_ATTR_ALL_DEFAULT => FlowKind::AllDefault,
        ffi::IBV_FLOW_ATTR_MC_DEFAULT => FlowKind::McDefault,
        ffi::IBV_FLOW_ATTR_SNIFFER => FlowKind::Sniffer,
        _ => return Err(libc::EINVAL),
    };
    // Egress rules and tunnels are a NIC's; softrdma steers what its raw QPs send.
    if a.comp_mask != 0 || a.port != 1 || a.flags & ffi::IBV_FLOW_ATTR_FLAGS_EGRESS != 0 {
        return Err(if a.port != 1 { libc::EINVAL } else { libc::EOPNOTSUPP });
    }
    if usize::from(a.num_of_specs) > MAX_SPECS_PER_FLOW {
        return Err(libc::EINVAL);
    }
    let mut at = (a as *const ffi::ibv_flow_attr).cast::<u8>().wrapping_add(size_of::<ffi::ibv_flow_attr>());
    let mut specs = Vec::with_capacity(usize::from(a.num_of_specs));
    for _ in 0..a.num_of_specs {
        // SAFETY: the caller's contract: a spec here, starting with its type (an enum,
        // 4 bytes) and its size (2 bytes), as every `ibv_flow_spec_*` does.
        let (ty, size) = unsafe { (at.cast::<u32>().read_unaligned(), at.add(4).cast::<u16>().read_unaligned()) };
        // SAFETY: a spec of `size` bytes here.
        specs.push(unsafe { spec_of(ty, usize::from(size), at) }?);
        let size = usize::from(size);
        at = at.wrapping_add(size);
    }
    Ok(FlowRule { kind, priority: a.priority, specs })
}

/// One spec of type `ty`, `size` bytes at `at`, as the engine takes it.
///
/// # Safety
/// `size` bytes are readable at `at`.
unsafe fn spec_of(ty: ffi::ibv_flow_spec_type, size: usize, at: *const u8) -> Result<FlowSpec, c_int> {
    /// Reads a spec struct `T` at `at` if `size` covers it.
    ///
    /// # Safety
    /// As for `spec_of`.
    unsafe fn read<T>(size: usize, at: *const u8) -> Result<T, c_int> {
        // SAFETY: `size` readable bytes cover a T.
        (size >= size_of::<T>()).then(|| unsafe { at.cast::<T>().read_unaligned() }).ok_or(libc::EINVAL)
    }
    let (layer, value, mask) = match ty {
        ffi::IBV_FLOW_SPEC_ETH => {
            // SAFETY: the caller's contract.
            let s: ffi::ibv_flow_spec_eth = unsafe { read(size, at) }?;
            (Layer::Eth, eth(&s.val), eth(&s.mask))
        }
        ffi::IBV_FLOW_SPEC_IPV4 => {
            // SAFETY: the caller's contract.
            let s: ffi::ibv_flow_spec_ipv4 = unsafe { read(size, at) }?;
            (Layer::Ipv4, ipv4(&s.val), ipv4(&s.mask))
        }
        ffi::IBV_FLOW_SPEC_IPV4_EXT => {
            // SAFETY: the caller's contract.
            let s: ffi::ibv_flow_spec_ipv4_ext = unsafe { read(size, at) }?;
            (Layer::Ipv4Ext, ipv4_ext(&s.val), ipv4_ext(&s.mask))
        }
        ffi::IBV_FLOW_SPEC_IPV6 => {
            // SAFETY: the caller's contract.
            let s: ffi::ibv_flow_spec_ipv6 = unsafe { read(size, at) }?;
            (Layer::Ipv6, ipv6(&s.val), ipv6(&s.mask))
        }
        ffi::IBV_FLOW_SPEC_TCP | ffi::IBV_FLOW_SPEC_UDP => {
            // SAFETY: the caller's contract.
            let s: ffi::ibv_flow_spec_tcp_udp = unsafe { read(size, at) }?;
            let layer = if ty == ffi::IBV_FLOW_SPEC_TCP { Layer::Tcp } else { Layer::Udp };
            (layer, ports(&s.val), ports(&s.mask))
        }
        // Inner (tunnelled) headers, tunnels, ESP, MPLS and actions: not steered here.
        _ => return Err(libc::EOPNOTSUPP),
    };
    Ok(FlowSpec { layer, value, mask })
}

// Each filter's fields hold network-order bytes: their in-memory bytes are the wire's.

fn eth(f: &ffi::ibv_flow_eth_filter) -> Vec<u8> {
    [&f.dst_mac[..], &f.src_mac[..], &f.ether_type.to_ne_bytes(), &f.vlan_tag.to_ne_bytes()].concat()
}

fn ipv4(f: &ffi::ibv_flow_ipv4_filter) -> Vec<u8> {
    [f.src_ip.to_ne_bytes(), f.dst_ip.to_ne_bytes()].concat()
}

fn ipv4_ext(f: &ffi::ibv_flow_ipv4_ext_filter) -> Vec<u8> {
    [&f.src_ip.to_ne_bytes()[..], &f.dst_ip.to_ne_bytes(), &[f.proto, f.tos, f.ttl, f.flags]].concat()
}

fn ipv6(f: &ffi::ibv_flow_ipv6_filter) -> Vec<u8> {
    let tail = [f.next_hdr, f.traffic_class, f.hop_limit];
    [&f.src_ip[..], &f.dst_ip[..], &f.flow_label.to_ne_bytes(), &tail].concat()
}

fn ports(f: &ffi::ibv_flow_tcp_udp_filter) -> Vec<u8> {
    [f.dst_port.to_ne_bytes(), f.src_port.to_ne_bytes()].concat()
}
