/*
 * Diagnostic-only stubs for libibverbs/librdmacm symbols that Debian 12's
 * python3-pyverbs (rdma-core 44) binds at load time but that softrdma's
 * libibverbs.so.1 does not (yet) export.  Python loads extension modules with
 * RTLD_NOW, so a single missing symbol makes `import pyverbs.qp` (and with it
 * every test module) fail before any test runs.
 *
 * `run --stub-missing` compiles this file with -DSTUB_<name> for exactly the
 * symbols that `ldd -r` reports missing from the library under test, links it
 * with a version script giving each symbol its rdma-core version node, and
 * LD_PRELOADs it.  Symbols the library does export are never stubbed.  Every
 * stub fails the way rdma-core does for an unsupported operation (NULL / -1 /
 * an error code, errno EOPNOTSUPP; librdmacm ones ENOSYS like softrdma's own
 * rdma_* entry points), so the tests that use them fail cleanly; the two fork
 * queries, which cannot fail that way, answer as rdma-core does on a current
 * kernel.
 */
#include <errno.h>
#include <stddef.h>
#include <sys/types.h>

#define NULL_E(e) do { errno = (e); return NULL; } while (0)
#define NEG1_E(e) do { errno = (e); return -1; } while (0)

/* ---- libibverbs ---- */
#ifdef STUB_ibv_query_qp_data_in_order
int ibv_query_qp_data_in_order(void *qp, int op, unsigned flags) { return 0; } /* "not guaranteed in order" */
#endif
#ifdef STUB_ibv_resize_cq
int ibv_resize_cq(void *cq, int cqe) { return EOPNOTSUPP; }
#endif
#ifdef STUB__ibv_query_gid_table
ssize_t _ibv_query_gid_table(void *ctx, void *entries, size_t max, unsigned flags, size_t entry_size) { return -EOPNOTSUPP; }
#endif
#ifdef STUB_ibv_get_async_event
int ibv_get_async_event(void *ctx, void *event) { NEG1_E(EOPNOTSUPP); }
#endif
#ifdef STUB_ibv_ack_async_event
void ibv_ack_async_event(void *event) { }
#endif
#ifdef STUB_ibv_import_device
void *ibv_import_device(int cmd_fd) { NULL_E(EOPNOTSUPP); }
#endif
#ifdef STUB_ibv_import_dm
void *ibv_import_dm(void *ctx, unsigned handle) { NULL_E(EOPNOTSUPP); }
#endif
#ifdef STUB_ibv_unimport_dm
void ibv_unimport_dm(void *dm) { }
#endif
#ifdef STUB_ibv_import_mr
void *ibv_import_mr(void *pd, unsigned handle) { NULL_E(EOPNOTSUPP); }
#endif
#ifdef STUB_ibv_unimport_mr
void ibv_unimport_mr(void *mr) { }
#endif
#ifdef STUB_ibv_import_pd
void *ibv_import_pd(void *ctx, unsigned handle) { NULL_E(EOPNOTSUPP); }
#endif
#ifdef STUB_ibv_unimport_pd
void ibv_unimport_pd(void *pd) { }
#endif
#ifdef STUB_ibv_reg_dmabuf_mr
void *ibv_reg_dmabuf_mr(void *pd, unsigned long off, size_t len, unsigned long iova, int fd, int access) { NULL_E(EOPNOTSUPP); }
#endif
#ifdef STUB_ibv_rereg_mr
int ibv_rereg_mr(void *mr, int flags, void *pd, void *addr, size_t len, int access) { errno = EOPNOTSUPP; return -1; /* IBV_REREG_MR_ERR_INPUT */ }
#endif
/* rdma-core has no "unsupported" answer for these: on a kernel with
 * copy-on-fork for pinned pages (5.13+) ibv_fork_init() returns 0 and
 * ibv_is_fork_initialized() IBV_FORK_UNNEEDED; the stubs answer the same
 * (softrdma pins nothing through the kernel). */
#ifdef STUB_ibv_fork_init
int ibv_fork_init(void) { return 0; }
#endif
#ifdef STUB_ibv_is_fork_initialized
int ibv_is_fork_initialized(void) { return 2; /* IBV_FORK_UNNEEDED */ }
#endif

/* ---- librdmacm ---- */
#ifdef STUB_rdma_get_devices
void **rdma_get_devices(int *num) { if (num) *num = 0; NULL_E(ENOSYS); }
#endif
#ifdef STUB_rdma_free_devices
void rdma_free_devices(void **list) { }
#endif
#ifdef STUB_rdma_create_ep
int rdma_create_ep(void **id, void *res, void *pd, void *attr) { NEG1_E(ENOSYS); }
#endif
#ifdef STUB_rdma_destroy_ep
void rdma_destroy_ep(void *id) { }
#endif
#ifdef STUB_rdma_get_request
int rdma_get_request(void *listen, void **id) { NEG1_E(ENOSYS); }
#endif
#ifdef STUB_rdma_join_multicast
int rdma_join_multicast(void *id, void *addr, void *ctx) { NEG1_E(ENOSYS); }
#endif
#ifdef STUB_rdma_join_multicast_ex
int rdma_join_multicast_ex(void *id, void *attr, void *ctx) { NEG1_E(ENOSYS); }
#endif
#ifdef STUB_rdma_leave_multicast
int rdma_leave_multicast(void *id, void *addr) { NEG1_E(ENOSYS); }
#endif
#ifdef STUB_rdma_get_remote_ece
int rdma_get_remote_ece(void *id, void *ece) { NEG1_E(ENOSYS); }
#endif
#ifdef STUB_rdma_set_local_ece
int rdma_set_local_ece(void *id, void *ece) { NEG1_E(ENOSYS); }
#endif
