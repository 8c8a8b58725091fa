//! The queries: device and port attributes, GIDs, and the strings rdma-core names its
//! enumerations with. The limits reported are the ones softrdma's verbs enforce.

use crate::device::{gid_of, node_guid, soft_context, SoftContext};
use crate::ffi;
use softrdma::verbs::Transport;
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::mem::{size_of, zeroed};

/// Most QPs, MRs, PDs, CQs, SRQs and AHs of a device (softrdma's `OpenConfig` defaults).
const OBJECTS_MAX: c_int = 16384;
/// Deepest send, receive and shared receive queue.
const QUEUE_DEPTH_MAX: c_int = 16384;
/// Most scatter/gather entries per request.
const SGE_MAX: c_int = 16;
/// Most READs and atomics a QP serves and keeps outstanding (rxe's figure).
const RD_ATOMIC_MAX: c_int = 128;

fn device_attr(soft: &SoftContext) -> ffi::ibv_device_attr {
    // SAFETY: plain C data; all-zero is valid.
    let mut a: ffi::ibv_device_attr = unsafe { zeroed() };
    let cfg = &soft.device.cfg;
    let version = concat!("softrdma ", env!("CARGO_PKG_VERSION"));
    for (d, &b) in a.fw_ver.iter_mut().zip(version.as_bytes()) {
        *d = b as c_char;
    }
    a.node_guid = node_guid(cfg.addr).to_be();
    // No IEEE OUI of its own: 0xffffff, as rdma_rxe and siw report.
    a.vendor_id = 0xff_ffff;
    a.sys_image_guid = a.node_guid;
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 0xffff_f000;
    a.max_qp = OBJECTS_MAX;
    a.max_qp_wr = QUEUE_DEPTH_MAX;
    a.device_cap_flags = ffi::IBV_DEVICE_RC_RNR_NAK_GEN | ffi::IBV_DEVICE_SYS_IMAGE_GUID | ffi::IBV_DEVICE_SRQ_RESIZE;
    if cfg.transport == Transport::RoceV2 {
        // Memory windows, type 1 and 2B (IBTA 10.6.7); not on iWARP, as siw.
        a.device_cap_flags |= ffi::IBV_DEVICE_MEM_WINDOW | ffi::IBV_DEVICE_MEM_WINDOW_TYPE_2B;
        // XRC (IBTA vol.1 14.2): domains, XRC SRQs, initiator and target QPs ([`crate::xrc`]).
        a.device_cap_flags |= ffi::IBV_DEVICE_XRC;
        a.max_mw = OBJECTS_MAX;
        // Multicast (IBTA 10.5), on IPv4 devices over kernel UDP sockets.
        if cfg.addr.is_ipv4() {
            use softrdma::engine::mcast::{MAX_MCAST_GROUPS, MAX_MCAST_MEMBERS};
            a.max_mcast_grp = MAX_MCAST_GROUPS as c_int;
            a.max_mcast_qp_attach = MAX_MCAST_MEMBERS as c_int;
            a.max_total_mcast_qp_attach = (MAX_MCAST_GROUPS * MAX_MCAST_MEMBERS) as c_int;
        }
    }
    a.max_sge = SGE_MAX;
    a.max_sge_rd = SGE_MAX;
    a.max_cq = OBJECTS_MAX;
    a.max_cqe = softrdma::verbs::MAX_CQE as c_int;
    a.max_mr = OBJECTS_MAX;
    a.max_pd = OBJECTS_MAX;
    a.max_qp_rd_atom = RD_ATOMIC_MAX;
    a.max_qp_init_rd_atom = RD_ATOMIC_MAX;
    a.max_res_rd_atom = RD_ATOMIC_MAX * OBJECTS_MAX;
    a.atomic_cap = if cfg.transport == Transport::RoceV2 { ffi::IBV_ATOMIC_HCA } else { ffi::IBV_ATOMIC_NONE };
    a.max_ah = OBJECTS_MAX;
    a.max_srq = OBJECTS_MAX;
    a.max_srq_wr = QUEUE_DEPTH_MAX;
    a.max_srq_sge = SGE_MAX;
    a.max_pkeys = 1;
    a.local_ca_ack_delay = 15;
    a.phys_port_cnt = 1;
    a
}

/// `ibv_query_device`.
///
/// # Safety
/// `ctx` is an open context; `attr` points to a `struct ibv_device_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(ctx: *mut ffi::ibv_context, attr: *mut ffi::ibv_device_attr) -> c_int {
    // SAFETY: the caller's contract.
    let (Some(soft), false) = (unsafe { soft_context(ctx) }, attr.is_null()) else { return libc::EINVAL };
    // SAFETY: attr is valid for writes.
    unsafe { attr.write(device_attr(soft)) };
    0
}

/// The device clock's rate in kHz (`hca_core_clock`): it counts nanoseconds.
pub const DEVICE_CLOCK_KHZ: u64 = 1_000_000;

/// `verbs_context.query_rt_values` (`ibv_query_rt_values_ex`): the device clock now, as
/// `raw_clock`; EINVAL for any other value asked.
///
/// # Safety
/// `values` points to a `struct ibv_values_ex`.
pub unsafe extern "C" fn query_rt_values_op(_ctx: *mut ffi::ibv_context, values: *mut ffi::ibv_values_ex) -> c_int {
    // SAFETY: the caller's contract.
    let Some(v) = (unsafe { values.as_mut() }) else { return libc::EINVAL };
    if v.comp_mask & !ffi::IBV_VALUES_MASK_RAW_CLOCK != 0 {
        return libc::EINVAL;
    }
    let now = softrdma::verbs::device_clock_ns();
    v.raw_clock.tv_sec = (now / 1_000_000_000) as _;
    v.raw_clock.tv_nsec = (now % 1_000_000_000) as _;
    v.comp_mask = ffi::IBV_VALUES_MASK_RAW_CLOCK;
    0
}

/// `verbs_context.query_device_ex`: the basic attributes, the device clock's rate, ODP,
/// device memory, receive-side scaling, tag matching on RoCEv2, and zero for every other
/// extension (no TSO).
///
/// # Safety
/// `ctx` is an open context; `attr` holds `attr_size` bytes.
pub unsafe extern "C" fn query_device_ex_op(
    ctx: *mut ffi::ibv_context,
    _input: *const ffi::ibv_query_device_ex_input,
    attr: *mut ffi::ibv_device_attr_ex,
    attr_size: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return libc::EINVAL };
    if attr.is_null() || attr_size < size_of::<ffi::ibv_device_attr>() {
        return libc::EINVAL;
    }
    // SAFETY: plain C data; all-zero is valid.
    let mut full: ffi::ibv_device_attr_ex = unsafe { zeroed() };
    full.orig_attr = device_attr(soft);
    full.phys_port_cnt_ex = 1;
    // Completion timestamps count nanoseconds on a 64-bit clock (the device clock).
    full.completion_timestamp_mask = u64::MAX;
    full.hca_core_clock = DEVICE_CLOCK_KHZ;
    full.odp_caps = odp_caps();
    full.xrc_odp_caps = full.odp_caps.per_transport_caps.rc_odp_caps;
    full.max_dm_size = softrdma::engine::MAX_DEVICE_MEMORY_BYTES as u64;
    // Receive-side scaling on raw packet QPs ([`crate::wq`]): work queues are SRQs.
    full.rss_caps = ffi::ibv_rss_caps {
        supported_qpts: 1 << ffi::IBV_QPT_RAW_PACKET,
        max_rwq_indirection_tables: crate::wq::IND_TABLES_MAX as u32,
        max_rwq_indirection_table_size: softrdma::engine::raw_qp::RSS_TABLE_MAX as u32,
        rx_hash_fields_mask: softrdma::engine::raw::HASH_FIELDS_KNOWN,
        rx_hash_function: ffi::IBV_RX_HASH_FUNC_TOEPLITZ as u8,
    };
    full.max_wq_type_rq = OBJECTS_MAX as u32;
    full.tm_caps = crate::tm::tm_caps(soft.engine().is_ok_and(|e| e.matches_tags()));
    let n = attr_size.min(size_of::<ffi::ibv_device_attr_ex>());
    // SAFETY: the caller's buffer holds attr_size bytes; the tail beyond ours is zeroed.
    unsafe {
        std::ptr::write_bytes(attr.cast::<u8>(), 0, attr_size);
        std::ptr::copy_nonoverlapping((&raw const full).cast::<u8>(), attr.cast::<u8>(), n);
    }
    0
}

/// On-demand paging: every region may be registered so (`IBV_ACCESS_ON_DEMAND`), the
/// implicit one included, on every transport and operation there is ([`objects`]).
fn odp_caps() -> ffi::ibv_odp_caps {
    let recv = ffi::IBV_ODP_SUPPORT_SEND | ffi::IBV_ODP_SUPPORT_RECV | ffi::IBV_ODP_SUPPORT_SRQ_RECV;
    let rdma = ffi::IBV_ODP_SUPPORT_WRITE | ffi::IBV_ODP_SUPPORT_READ | ffi::IBV_ODP_SUPPORT_ATOMIC;
    // SAFETY: plain C data; all-zero is valid.
    let mut caps: ffi::ibv_odp_caps = unsafe { zeroed() };
    caps.general_caps = u64::from(ffi::IBV_ODP_SUPPORT | ffi::IBV_ODP_SUPPORT_IMPLICIT);
    caps.per_transport_caps.rc_odp_caps = recv | rdma;
    caps.per_transport_caps.uc_odp_caps = recv | ffi::IBV_ODP_SUPPORT_WRITE;
    caps.per_transport_caps.ud_odp_caps = recv;
    caps
}

fn port_attr(soft: &SoftContext) -> ffi::ibv_port_attr {
    // SAFETY: plain C data; all-zero is valid.
    let mut p: ffi::ibv_port_attr = unsafe { zeroed() };
    let cfg = &soft.device.cfg;
    let active = softrdma::transport::udp::active_mtu(cfg.addr).map_or(ffi::IBV_MTU_1024, mtu_enum);
    p.state = ffi::IBV_PORT_ACTIVE;
    p.max_mtu = ffi::IBV_MTU_4096;
    p.active_mtu = active;
    p.gid_tbl_len = 1;
    p.port_cap_flags = ffi::IBV_PORT_CM_SUP;
    p.max_msg_sz = 1 << 31;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    // 4X at 10 Gb/s a lane (QDR's code): about what one core moves, as the port's speed.
    p.active_width = 2;
    p.active_speed = 4;
    p.phys_state = 5; // LinkUp
    p.link_layer = ffi::IBV_LINK_LAYER_ETHERNET as u8;
    p
}

fn mtu_enum(m: softrdma::verbs::Mtu) -> ffi::ibv_mtu {
    match m.bytes() {
        256 => ffi::IBV_MTU_256,
        512 => ffi::IBV_MTU_512,
        1024 => ffi::IBV_MTU_1024,
        2048 => ffi::IBV_MTU_2048,
        _ => ffi::IBV_MTU_4096,
    }
}

/// Writes the port's attributes into the first `len` bytes of `out`: port 1 only.
unsafe fn write_port(ctx: *mut ffi::ibv_context, port: u8, out: *mut u8, len: usize) -> c_int {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return libc::EINVAL };
    if port != 1 || out.is_null() {
        return libc::EINVAL;
    }
    let attr = port_attr(soft);
    let n = len.min(size_of::<ffi::ibv_port_attr>());
    // SAFETY: `out` holds `len` bytes.
    unsafe { std::ptr::copy_nonoverlapping((&raw const attr).cast::<u8>(), out, n) };
    0
}

/// `verbs_context.query_port`, which the inline `ibv_query_port` calls.
///
/// # Safety
/// `ctx` is an open context; `attr` holds `len` bytes.
pub unsafe extern "C" fn query_port_op(
    ctx: *mut ffi::ibv_context,
    port: u8,
    attr: *mut ffi::ibv_port_attr,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { write_port(ctx, port, attr.cast(), len) }
}

/// The exported `ibv_query_port`, for callers built without the inline: the older,
/// shorter structure.
///
/// # Safety
/// `ctx` is an open context; `attr` points to a `struct _compat_ibv_port_attr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ffi::ibv_context,
    port: u8,
    attr: *mut ffi::_compat_ibv_port_attr,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { write_port(ctx, port, attr.cast(), size_of::<ffi::_compat_ibv_port_attr>()) }
}

/// `ibv_query_gid`: index 0 is the device's address; -1 for any other.
///
/// # Safety
/// `ctx` is an open context; `gid` points to a `union ibv_gid`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ffi::ibv_gid,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return -1 };
    if port != 1 || index != 0 || gid.is_null() {
        return -1;
    }
    // SAFETY: gid is valid for writes.
    unsafe { (*gid).raw = gid_of(soft.device.cfg.addr) };
    0
}

/// `ibv_query_gid_type` (rdma-core's private ABI, which `ibv_devinfo` uses): RoCE v2 (1)
/// for a RoCEv2 device, IB/RoCE v1 (0) for iWARP, as siw reports.
///
/// # Safety
/// `ctx` is an open context; `kind` points to an int.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ffi::ibv_context,
    port: u8,
    index: c_uint,
    kind: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return libc::EINVAL };
    if port != 1 || index != 0 || kind.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: kind is valid for writes.
    unsafe { *kind = c_int::from(soft.device.cfg.transport == Transport::RoceV2) };
    0
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`, which perftest uses).
///
/// # Safety
/// `ctx` is an open context; `entry` holds `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ffi::ibv_context,
    port: u32,
    index: u32,
    entry: *mut ffi::ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    let Some(soft) = (unsafe { soft_context(ctx) }) else { return libc::EINVAL };
    if flags != 0 || entry.is_null() || entry_size < size_of::<ffi::ibv_gid_entry>() {
        return libc::EINVAL;
    }
    if port != 1 || index != 0 {
        return libc::ENODATA;
    }
    let cfg = &soft.device.cfg;
    let kind = if cfg.transport == Transport::RoceV2 { ffi::IBV_GID_TYPE_ROCE_V2 } else { ffi::IBV_GID_TYPE_IB };
    let e = ffi::ibv_gid_entry {
        gid: ffi::ibv_gid { raw: gid_of(cfg.addr) },
        gid_index: 0,
        port_num: 1,
        gid_type: kind,
        ndev_ifindex: ifindex_of(cfg.addr),
    };
    // SAFETY: entry is valid for writes.
    unsafe { entry.write(e) };
    0
}

/// The index of the interface holding `addr` (0: none), for `ibv_gid_entry.ndev_ifindex`.
fn ifindex_of(addr: std::net::IpAddr) -> u32 {
    let Some(name) = softrdma::transport::udp::interface_of(addr) else { return 0 };
    let Ok(name) = std::ffi::CString::new(name) else { return 0 };
    // SAFETY: a NUL-terminated name.
    unsafe { libc::if_nametoindex(name.as_ptr()) }
}

/// `ibv_read_sysfs_file`: there is no sysfs device behind softrdma.
///
/// # Safety
/// Reads none of its arguments.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    crate::set_errno(libc::ENOENT);
    -1
}

/// A static C string for the tables below.
fn c(s: &'static CStr) -> *const c_char {
    s.as_ptr()
}

/// `ibv_node_type_str`.
#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ffi::ibv_node_type) -> *const c_char {
    c(match t {
        ffi::IBV_NODE_CA => c"InfiniBand channel adapter",
        ffi::IBV_NODE_SWITCH => c"InfiniBand switch",
        ffi::IBV_NODE_ROUTER => c"InfiniBand router",
        ffi::IBV_NODE_RNIC => c"iWARP NIC",
        ffi::IBV_NODE_USNIC => c"usNIC",
        ffi::IBV_NODE_USNIC_UDP => c"usNIC UDP",
        ffi::IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    })
}

/// `ibv_event_type_str`: rdma-core's words for each asynchronous event.
#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: ffi::ibv_event_type) -> *const c_char {
    const NAMES: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    const _: () = assert!(ffi::IBV_EVENT_WQ_FATAL as usize == NAMES.len() - 1);
    c(NAMES.get(e as usize).copied().unwrap_or(c"unknown"))
}

/// `ibv_port_state_str`.
#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ffi::ibv_port_state) -> *const c_char {
    const NAMES: [&CStr; 6] =
        [c"PORT_NOP", c"PORT_DOWN", c"PORT_INIT", c"PORT_ARMED", c"PORT_ACTIVE", c"PORT_ACTIVE_DEFER"];
    c(NAMES.get(s as usize).copied().unwrap_or(c"invalid state"))
}

/// `ibv_wc_status_str`.
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(s: ffi::ibv_wc_status) -> *const c_char {
    const NAMES: [&CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    c(NAMES.get(s as usize).copied().unwrap_or(c"unknown"))
}

/// `ibv_query_pkey`: one P_Key, the default full-membership 0xffff, at index 0.
///
/// # Safety
/// `ctx` is an open context; `pkey` points to a `__be16`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(ctx: *mut ffi::ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int {
    // SAFETY: the caller's contract.
    if unsafe { soft_context(ctx) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
        return -1;
    }
    // SAFETY: pkey is valid for writes.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order), or -1.
///
/// # Safety
/// `ctx` is an open context.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(ctx: *mut ffi::ibv_context, port: u8, pkey: u16) -> c_int {
    // SAFETY: the caller's contract.
    let known = unsafe { soft_context(ctx) }.is_some() && port == 1 && u16::from_be(pkey) == 0xffff;
    if known {
        0
    } else {
        crate::set_errno(libc::ENOENT);
        -1
    }
}

/// `ibv_get_device_index`: the device's place in the configuration.
///
/// # Safety
/// `dev` came from `ibv_get_device_list`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ffi::ibv_device) -> c_int {
    // SAFETY: the caller's contract.
    let Some(d) = (unsafe { crate::device::soft_device_of(dev) }) else { return -1 };
    crate::device::index_of(d).map_or(-1, |i| i as c_int)
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table`): the device's one GID.
///
/// # Safety
/// `ctx` is an open context; `entries` holds `max` entries of `entry_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    ctx: *mut ffi::ibv_context,
    entries: *mut ffi::ibv_gid_entry,
    max: usize,
    flags: u32,
    entry_size: usize,
) -> isize {
    if max == 0 || entries.is_null() {
        return -(libc::EINVAL as isize);
    }
    // SAFETY: the caller's contract.
    match unsafe { _ibv_query_gid_ex(ctx, 1, 0, entries, flags, entry_size) } {
        0 => 1,
        e => -(e as isize),
    }
}
