//! Each exported function under rdma-core's symbol version: the default version (`@@`)
//! that applications built against Debian 12's rdma-core 44 reference. The version nodes
//! are declared in `exports.map`; `tests/abi.rs` checks every binding here against the
//! installed libibverbs.so.1.

std::arch::global_asm!(
    ".symver ibv_get_device_list, ibv_get_device_list@@IBVERBS_1.1",
    ".symver ibv_free_device_list, ibv_free_device_list@@IBVERBS_1.1",
    ".symver ibv_get_device_name, ibv_get_device_name@@IBVERBS_1.1",
    ".symver ibv_get_device_guid, ibv_get_device_guid@@IBVERBS_1.1",
    ".symver ibv_open_device, ibv_open_device@@IBVERBS_1.1",
    ".symver ibv_close_device, ibv_close_device@@IBVERBS_1.1",
    ".symver ibv_query_device, ibv_query_device@@IBVERBS_1.1",
    ".symver ibv_query_port, ibv_query_port@@IBVERBS_1.1",
    ".symver ibv_query_gid, ibv_query_gid@@IBVERBS_1.1",
    ".symver ibv_query_gid_type, ibv_query_gid_type@@IBVERBS_PRIVATE_34",
    ".symver _ibv_query_gid_ex, _ibv_query_gid_ex@@IBVERBS_1.11",
    ".symver ibv_read_sysfs_file, ibv_read_sysfs_file@@IBVERBS_1.0",
    ".symver ibv_node_type_str, ibv_node_type_str@@IBVERBS_1.1",
    ".symver ibv_port_state_str, ibv_port_state_str@@IBVERBS_1.1",
    ".symver ibv_wc_status_str, ibv_wc_status_str@@IBVERBS_1.1",
);
