//! What softrdma does not implement, answered as rdma-core answers for a missing
//! capability, never a missing symbol: an application (or a library it links, such as
//! perftest's libmlx5 and libefa, which the loader binds eagerly) must load and run.
//!
//! - rdma-core's provider-internal interface (`ibv_cmd_*`, `verbs_*`: IBVERBS_PRIVATE_34)
//!   drives a kernel uverbs device; no softrdma device has one. Called anyway, each
//!   answers EOPNOTSUPP (or NULL, or nothing).
//! - Public verbs softrdma lacks so far (ECE, kernel-structure copies) answer
//!   the errno rdma-core gives when a provider lacks them.

use std::ffi::{c_int, c_void};

/// Exports each `name` under `version` as a function of no arguments (C lets a callee
/// ignore its arguments) returning `$ret` made by `$val`.
macro_rules! unsupported {
    ($version:literal, $ret:ty, $val:expr, [$($name:ident),* $(,)?]) => {
        $(
            #[no_mangle]
            #[allow(missing_docs)]
            pub extern "C" fn $name() -> $ret {
                $val
            }
            std::arch::global_asm!(concat!(".symver ", stringify!($name), ", ", stringify!($name), "@@", $version));
        )*
    };
}

fn eopnotsupp() -> c_int {
    crate::set_errno(libc::EOPNOTSUPP);
    libc::EOPNOTSUPP
}

/// librdmacm's way: -1, errno EOPNOTSUPP.
fn minus_eopnotsupp() -> c_int {
    crate::set_errno(libc::EOPNOTSUPP);
    -1
}

fn enosys() -> c_int {
    crate::set_errno(libc::ENOSYS);
    -1
}

fn null() -> *mut c_void {
    crate::set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

unsupported!(
    "IBVERBS_PRIVATE_34",
    c_int,
    eopnotsupp(),
    [
        execute_ioctl,
        ibv_cmd_advise_mr,
        ibv_cmd_alloc_dm,
        ibv_cmd_alloc_mw,
        ibv_cmd_alloc_pd,
        ibv_cmd_attach_mcast,
        ibv_cmd_close_xrcd,
        ibv_cmd_create_ah,
        ibv_cmd_create_cq,
        ibv_cmd_create_qp,
        ibv_cmd_poll_cq,
        ibv_cmd_post_recv,
        ibv_cmd_post_send,
        ibv_cmd_post_srq_recv,
        ibv_cmd_req_notify_cq,
        __ioctl_final_num_attrs,
        ibv_cmd_create_counters,
        ibv_cmd_create_cq_ex,
        ibv_cmd_create_flow,
        ibv_cmd_create_flow_action_esp,
        ibv_cmd_create_qp_ex,
        ibv_cmd_create_qp_ex2,
        ibv_cmd_create_rwq_ind_table,
        ibv_cmd_create_srq,
        ibv_cmd_create_srq_ex,
        ibv_cmd_create_wq,
        ibv_cmd_dealloc_mw,
        ibv_cmd_dealloc_pd,
        ibv_cmd_dereg_mr,
        ibv_cmd_destroy_ah,
        ibv_cmd_destroy_counters,
        ibv_cmd_destroy_cq,
        ibv_cmd_destroy_flow,
        ibv_cmd_destroy_flow_action,
        ibv_cmd_destroy_qp,
        ibv_cmd_destroy_rwq_ind_table,
        ibv_cmd_destroy_srq,
        ibv_cmd_destroy_wq,
        ibv_cmd_detach_mcast,
        ibv_cmd_free_dm,
        ibv_cmd_get_context,
        ibv_cmd_modify_cq,
        ibv_cmd_modify_flow_action_esp,
        ibv_cmd_modify_qp,
        ibv_cmd_modify_qp_ex,
        ibv_cmd_modify_srq,
        ibv_cmd_modify_wq,
        ibv_cmd_open_qp,
        ibv_cmd_open_xrcd,
        ibv_cmd_query_context,
        ibv_cmd_query_device_any,
        ibv_cmd_query_mr,
        ibv_cmd_query_port,
        ibv_cmd_query_qp,
        ibv_cmd_query_srq,
        ibv_cmd_read_counters,
        ibv_cmd_reg_dm_mr,
        ibv_cmd_reg_dmabuf_mr,
        ibv_cmd_reg_mr,
        ibv_cmd_rereg_mr,
        ibv_cmd_resize_cq,
    ]
);
unsupported!("IBVERBS_PRIVATE_34", *mut c_void, null(), [_verbs_init_and_alloc_context, verbs_open_device]);
// No sysfs behind softrdma's devices: a read of it fails (-1), as for a missing file.
unsupported!("IBVERBS_PRIVATE_34", c_int, enosys(), [ibv_read_ibdev_sysfs_file]);
unsupported!(
    "IBVERBS_PRIVATE_34",
    (),
    (),
    [__verbs_log, verbs_init_cq, verbs_register_driver_34, verbs_set_ops, verbs_uninit_context,]
);
unsupported!(
    "IBVERBS_1.0",
    (),
    (),
    [ibv_copy_path_rec_from_kern, ibv_copy_path_rec_to_kern, ibv_copy_qp_attr_from_kern]
);
/// A provider registering itself (rdma-core keeps it as a hidden, old-binary binding):
/// softrdma's devices are its own, none loads.
#[no_mangle]
pub extern "C" fn ibv_register_driver() {}
std::arch::global_asm!(".symver ibv_register_driver, ibv_register_driver@IBVERBS_1.1");
unsupported!("IBVERBS_1.0", *mut c_void, null(), [ibv_get_sysfs_path]);
unsupported!("IBVERBS_1.1", (), (), [ibv_copy_ah_attr_from_kern]);
unsupported!("IBVERBS_1.1", c_int, eopnotsupp(), [ibv_resolve_eth_l2_from_gid]);
unsupported!("IBVERBS_1.10", c_int, eopnotsupp(), [ibv_query_ece, ibv_set_ece]);
// Dma-buf memory.
unsupported!("IBVERBS_1.12", *mut c_void, null(), [ibv_reg_dmabuf_mr]);
// librdmacm beyond what `cm.rs` implements.
// ECE (enhanced connection establishment): none, as librdmacm answers over a device without it.
unsupported!("RDMACM_1.3", c_int, minus_eopnotsupp(), [rdma_get_remote_ece, rdma_set_local_ece]);

/// rdma-core's switch for providers' disassociation (a kernel device going away): there is
/// none here.
#[no_mangle]
pub static verbs_allow_disassociate_destroy: bool = false;
std::arch::global_asm!(
    ".symver verbs_allow_disassociate_destroy, verbs_allow_disassociate_destroy@@IBVERBS_PRIVATE_34"
);

/// `ibv_fork_init`: nothing to prepare (below).
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}
/// `ibv_is_fork_initialized`: IBV_FORK_UNNEEDED, as on a kernel that keeps pinned pages
/// safe across fork: softrdma pins nothing.
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    2
}
/// `ibv_query_qp_data_in_order`: no promise beyond what IBTA makes (0), though softrdma
/// places a QP's data in PSN order.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order(_qp: *mut c_void, _op: c_int, _flags: u32) -> c_int {
    0
}
std::arch::global_asm!(
    ".symver ibv_fork_init, ibv_fork_init@@IBVERBS_1.1",
    ".symver ibv_is_fork_initialized, ibv_is_fork_initialized@@IBVERBS_1.13",
    ".symver ibv_query_qp_data_in_order, ibv_query_qp_data_in_order@@IBVERBS_1.14"
);

/// `ibv_dofork_range` and `ibv_dontfork_range`: softrdma pins nothing, so a region stays
/// the process's own memory across fork; nothing to do.
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}
std::arch::global_asm!(
    ".symver ibv_dofork_range, ibv_dofork_range@@IBVERBS_1.1",
    ".symver ibv_dontfork_range, ibv_dontfork_range@@IBVERBS_1.1"
);
