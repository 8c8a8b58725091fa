/* Device memory as an application uses it: ibv_query_device_ex reports max_dm_size; more
 * than that is refused; copies in and out move 4-byte words at 4-byte offsets (others are
 * refused); a zero-based region over the memory from offset 64 takes a peer's WRITE at its
 * address 0, which lands at the memory's byte 64, and serves a READ; a region without
 * IBV_ACCESS_ZERO_BASED or past the memory's end is refused. Two RC QPs of one device.
 * Built against rdma-core's headers and run on softrdma's library by capi/tests/apps.rs.
 * Prints "device memory ok" and exits 0. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

#define DM_LEN 1024

static void rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, struct ibv_sge *sge, uint64_t raddr,
		 uint32_t rkey)
{
	struct ibv_send_wr wr = { .wr_id = op, .sg_list = sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send");
	struct ibv_wc wc = wait_wc(cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == op, "the operation succeeds");
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_device_attr_ex dev;
	struct ibv_context *ctx = open_first(&list, &dev);
	CHECK(dev.max_dm_size >= DM_LEN, "device memory offered");
	struct ibv_alloc_dm_attr too_big = { .length = dev.max_dm_size + 1 };
	CHECK(!ibv_alloc_dm(ctx, &too_big) && errno == ENOMEM, "no more than max_dm_size");
	struct ibv_alloc_dm_attr da = { .length = DM_LEN, .log_align_req = 6 };
	struct ibv_dm *dm = ibv_alloc_dm(ctx, &da);
	CHECK(dm, "ibv_alloc_dm");
	char pattern[256], back[256];
	for (int i = 0; i < 256; i++)
		pattern[i] = (char)(i * 5 + 3);
	CHECK(!ibv_memcpy_to_dm(dm, 0, pattern, 256), "copy in");
	CHECK(ibv_memcpy_to_dm(dm, 2, pattern, 8) == EINVAL, "unaligned offset refused");
	CHECK(ibv_memcpy_to_dm(dm, 0, pattern, 6) == EINVAL, "partial word refused");
	CHECK(ibv_memcpy_from_dm(back, dm, DM_LEN - 4, 8) == EINVAL, "past the end refused");
	CHECK(!ibv_memcpy_from_dm(back, dm, 0, 256) && !memcmp(back, pattern, 256), "copy out");

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	CHECK(!ibv_reg_dm_mr(pd, dm, 0, 64, access) && errno == EINVAL, "zero-based addressing required");
	CHECK(!ibv_reg_dm_mr(pd, dm, 64, DM_LEN, access | IBV_ACCESS_ZERO_BASED) && errno == EINVAL,
	      "a region past the memory's end refused");
	struct ibv_mr *dmr = ibv_reg_dm_mr(pd, dm, 64, 512, access | IBV_ACCESS_ZERO_BASED);
	CHECK(dmr, "ibv_reg_dm_mr");
	char *host = calloc(1, 4096);
	struct ibv_mr *hmr = ibv_reg_mr(pd, host, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				       .cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &qa), *b = ibv_create_qp(pd, &qa);
	CHECK(hmr && a && b, "region and QPs");
	union ibv_gid gid;
	CHECK(!ibv_query_gid(ctx, 1, 0, &gid), "GID 0");
	connect_to(a, b->qp_num, &gid, access);
	connect_to(b, a->qp_num, &gid, access);

	memset(host, 0x5a, 128);
	struct ibv_sge s = { .addr = (uintptr_t)host, .length = 128, .lkey = hmr->lkey };
	rdma(a, cq, IBV_WR_RDMA_WRITE, &s, 0, dmr->rkey);
	CHECK(!ibv_memcpy_from_dm(back, dm, 0, 256), "copy out after the WRITE");
	CHECK(!memcmp(back, pattern, 64), "bytes before the region untouched");
	for (int i = 64; i < 192; i++)
		CHECK(back[i] == 0x5a, "the WRITE landed at the memory's byte 64");
	struct ibv_sge r = { .addr = (uintptr_t)(host + 1024), .length = 32, .lkey = hmr->lkey };
	rdma(a, cq, IBV_WR_RDMA_READ, &r, 128, dmr->rkey);
	CHECK(!memcmp(host + 1024, back + 64 + 128, 32), "the READ came from the region's byte 128");

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy QPs");
	CHECK(!ibv_dereg_mr(dmr) && !ibv_dereg_mr(hmr) && !ibv_free_dm(dm), "dereg and free");
	CHECK(!ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd) && !ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	free(host);
	puts("device memory ok");
	return 0;
}
