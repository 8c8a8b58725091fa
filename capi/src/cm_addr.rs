//! Socket addresses between C (`struct sockaddr*`) and Rust, and which device serves an
//! address (librdmacm binds an id to the device that owns its address).

use crate::device::{ibv_get_device_list, ibv_open_device, soft_device_of};
use crate::ffi;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::OnceLock;

/// The address at `sa`, if it is IPv4 or IPv6.
///
/// # Safety
/// `sa` is NULL or points to a socket address of its family's size.
pub unsafe fn from_c(sa: *const ffi::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller's contract; the family says which structure it is.
    let family = i32::from(unsafe { sa.as_ref() }?.sa_family);
    if family == libc::AF_INET {
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*sa.cast::<libc::sockaddr_in>() };
        let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        return Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))));
    }
    if family == libc::AF_INET6 {
        // SAFETY: an AF_INET6 address is a sockaddr_in6.
        let sin6 = unsafe { &*sa.cast::<libc::sockaddr_in6>() };
        let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
        let port = u16::from_be(sin6.sin6_port);
        return Some(SocketAddr::V6(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id)));
    }
    None
}

/// `a` written into a `sockaddr_storage`.
pub fn to_storage(a: SocketAddr, out: &mut ffi::sockaddr_storage) {
    // SAFETY: sockaddr_storage has room and alignment for either structure, and the
    // all-zero value is valid for both.
    unsafe {
        std::ptr::write_bytes(out, 0, 1);
        match a {
            SocketAddr::V4(v4) => {
                let sin = &mut *(out as *mut ffi::sockaddr_storage).cast::<libc::sockaddr_in>();
                sin.sin_family = libc::AF_INET as u16;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            }
            SocketAddr::V6(v6) => {
                let sin6 = &mut *(out as *mut ffi::sockaddr_storage).cast::<libc::sockaddr_in6>();
                sin6.sin6_family = libc::AF_INET6 as u16;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
            }
        }
    }
}

/// Every configured device, opened once for rdma_cm (as librdmacm opens them all). A child
/// forked after this may use them: each context reaches its device's engine, which is the
/// child's own (`SoftDevice::engine`).
fn contexts() -> &'static [(IpAddr, usize)] {
    static OPEN: OnceLock<Vec<(IpAddr, usize)>> = OnceLock::new();
    OPEN.get_or_init(open_all)
}

fn open_all() -> Vec<(IpAddr, usize)> {
    let mut n = 0;
    // SAFETY: our own device list, walked to its NULL and never freed (the contexts
    // hold devices that live for the process anyway).
    let list = unsafe { ibv_get_device_list(&mut n) };
    (0..n.max(0) as usize)
        .filter_map(|i| {
            // SAFETY: i < n entries.
            let dev = unsafe { *list.add(i) };
            // SAFETY: a device from the list.
            let addr = unsafe { soft_device_of(dev) }?.cfg.addr;
            // SAFETY: as above.
            let ctx = unsafe { ibv_open_device(dev) };
            (!ctx.is_null()).then_some((addr, ctx as usize))
        })
        .collect()
}

/// The context of the device that owns `local` (or, for a wildcard or no address, the
/// first device of `peer`'s family, or the first device).
pub fn context_for(local: Option<IpAddr>, peer: Option<IpAddr>) -> Option<*mut ffi::ibv_context> {
    let all = contexts();
    let pick = match local.filter(|a| !a.is_unspecified()) {
        Some(a) => all.iter().find(|(d, _)| *d == a),
        None => match peer {
            Some(p) => all.iter().find(|(d, _)| d.is_ipv4() == p.is_ipv4()),
            None => all.first(),
        },
    };
    pick.map(|&(_, ctx)| ctx as *mut ffi::ibv_context)
}

/// `RAI_PASSIVE` (rdma/rdma_cma.h): the address is the local one, to listen on.
const RAI_PASSIVE: std::ffi::c_int = 1;

/// One `rdma_addrinfo` and the addresses it points into, freed together.
#[repr(C)]
struct AddrInfoBox {
    ai: ffi::rdma_addrinfo,
    src: ffi::sockaddr_storage,
    dst: ffi::sockaddr_storage,
}

/// `node:service` resolved (numeric or by name), the first IPv4 or IPv6 address.
///
/// # Safety
/// `node` and `service` are NULL or C strings.
unsafe fn resolve(node: *const std::ffi::c_char, service: *const std::ffi::c_char) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    // SAFETY: the caller's contract.
    let text = |p: *const std::ffi::c_char| {
        (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let host = text(node).unwrap_or_else(|| "0.0.0.0".to_string());
    let port: u16 = text(service).map_or(Some(0), |s| s.parse().ok())?;
    (host.as_str(), port).to_socket_addrs().ok()?.next()
}

/// `rdma_getaddrinfo`: one result, the destination (or, with RAI_PASSIVE, the source).
///
/// # Safety
/// `node`, `service` NULL or C strings; `hints` NULL or valid; `res` a valid out-pointer.
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const std::ffi::c_char,
    service: *const std::ffi::c_char,
    hints: *const ffi::rdma_addrinfo,
    res: *mut *mut ffi::rdma_addrinfo,
) -> std::ffi::c_int {
    // SAFETY: the caller's contract.
    let (Some(addr), false) = (unsafe { resolve(node, service) }, res.is_null()) else {
        crate::set_errno(libc::EADDRNOTAVAIL);
        return -1;
    };
    // SAFETY: the caller's contract.
    let hints = unsafe { hints.as_ref() };
    // SAFETY: plain C data; all-zero is valid.
    let mut b: Box<AddrInfoBox> = Box::new(unsafe { std::mem::zeroed() });
    let passive = hints.is_some_and(|h| h.ai_flags & RAI_PASSIVE != 0);
    b.ai.ai_flags = hints.map_or(0, |h| h.ai_flags);
    b.ai.ai_family = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    b.ai.ai_qp_type = hints.map_or(0, |h| h.ai_qp_type).max(ffi::IBV_QPT_RC as std::ffi::c_int);
    b.ai.ai_port_space = hints.map_or(0, |h| h.ai_port_space).max(ffi::RDMA_PS_TCP as std::ffi::c_int);
    let len = if addr.is_ipv4() { 16 } else { 28 };
    if passive {
        to_storage(addr, &mut b.src);
        b.ai.ai_src_len = len;
    } else {
        to_storage(addr, &mut b.dst);
        b.ai.ai_dst_len = len;
        // A source the application names in the hints (librdmacm's examples resolve
        // `-b` first, passively, then pass it along) comes back with the destination.
        // SAFETY: the hints' source address, if any, is a valid socket address.
        if let Some(src) = hints.and_then(|h| unsafe { from_c(h.ai_src_addr) }) {
            to_storage(src, &mut b.src);
            b.ai.ai_src_len = if src.is_ipv4() { 16 } else { 28 };
        }
    }
    let raw = Box::into_raw(b);
    // SAFETY: just allocated; the pointers name its own fields.
    unsafe {
        if (*raw).ai.ai_src_len > 0 {
            (*raw).ai.ai_src_addr = (&raw mut (*raw).src).cast();
        }
        if (*raw).ai.ai_dst_len > 0 {
            (*raw).ai.ai_dst_addr = (&raw mut (*raw).dst).cast();
        }
        *res = raw.cast();
    }
    0
}

/// `rdma_freeaddrinfo`.
///
/// # Safety
/// `res` came from [`rdma_getaddrinfo`] (or is NULL).
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut ffi::rdma_addrinfo) {
    if !res.is_null() {
        // SAFETY: allocated by Box in rdma_getaddrinfo, given back once.
        drop(unsafe { Box::from_raw(res.cast::<AddrInfoBox>()) });
    }
}

/// `rdma_get_devices`: every configured device's context, NULL-terminated.
///
/// # Safety
/// `num` is NULL or points to an int.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num: *mut std::ffi::c_int) -> *mut *mut ffi::ibv_context {
    let all = contexts();
    // SAFETY: calloc of n+1 pointers, given back to rdma_free_devices.
    let list = unsafe { libc::calloc(all.len() + 1, std::mem::size_of::<usize>()) }.cast::<*mut ffi::ibv_context>();
    if list.is_null() {
        return list;
    }
    for (i, &(_, ctx)) in all.iter().enumerate() {
        // SAFETY: i < n.
        unsafe { *list.add(i) = ctx as *mut ffi::ibv_context };
    }
    if !num.is_null() {
        // SAFETY: the caller's contract.
        unsafe { *num = all.len() as std::ffi::c_int };
    }
    list
}

/// `rdma_free_devices` (the contexts stay open, as librdmacm's do).
///
/// # Safety
/// `list` came from [`rdma_get_devices`].
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut ffi::ibv_context) {
    // SAFETY: calloc'd by rdma_get_devices.
    unsafe { libc::free(list.cast()) };
}
